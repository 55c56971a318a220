"""A Cosmos3 world model with random weights built directly on the device, no checkpoint on disk.

Edge at full size is ~4 B parameters: building it on the CPU in fp32 and writing safetensors would
take longer than the whole GPU bench, so the modules are constructed under the target device and
initialised there, then handed to `Cosmos3WorldModel` as `Cosmos3Components`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .archs import BenchArch


@torch.no_grad()
def _randomize_(module: torch.nn.Module, seed: int, std: float) -> None:
    """Small random weights (norm scales near 1), drawn on the module's own device."""
    for index, (name, param) in enumerate(module.named_parameters()):
        generator = torch.Generator(device=param.device).manual_seed(seed + index)
        noise = torch.randn(param.shape, generator=generator, device=param.device, dtype=torch.float32)
        if name.endswith("weight") and "norm" in name:
            param.copy_(1.0 + 0.1 * noise)
        else:
            param.copy_(std * noise)


def _cast(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`dtype` everywhere except the modules the class keeps in float32, as `from_pretrained(torch_dtype=...)`."""
    keep = set(getattr(module, "_keep_in_fp32_modules", None) or ())
    tensors = [*module.named_parameters(), *module.named_buffers()]
    for name, tensor in tensors:
        if tensor.is_floating_point():
            target = torch.float32 if keep.intersection(name.split(".")) else dtype
            tensor.data = tensor.data.to(target)
    return module


def build_components(arch: BenchArch, device: torch.device, dtype: torch.dtype, seed: int = 0,
                     vae_dtype: torch.dtype | None = None):
    """`Cosmos3Components` of `arch` with random weights: the transformer in `dtype`, the VAE in `vae_dtype`
    (default `dtype`; `load()` gives users a float32 VAE), both on `device`."""
    from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer
    from worldstep.engine.models.cosmos3.checkpoint import SCHEDULER_CONFIG, build_tokenizer
    from worldstep.engine.models.cosmos3.loader import Cosmos3Components

    transformer_arch = dict(arch.architecture["transformer"])
    vae_arch = dict(arch.architecture["vae"])
    z_dim = int(vae_arch["z_dim"])
    vae_arch.setdefault("latents_mean", [0.0] * z_dim)
    vae_arch.setdefault("latents_std", [1.0] * z_dim)
    with torch.device(device):
        transformer = _cast(Cosmos3OmniTransformer(**transformer_arch), dtype)
        vae = _cast(AutoencoderKLWan(**vae_arch), vae_dtype or dtype)
    _randomize_(transformer, seed, std=0.02)
    _randomize_(vae, seed + 1, std=0.05)
    transformer.eval().requires_grad_(False)
    vae.eval().requires_grad_(False)
    return Cosmos3Components(
        path=Path(f"<in-memory {arch.name}>"), transformer=transformer, vae=vae,
        unipc_config=dict(SCHEDULER_CONFIG), tokenizer=build_tokenizer(int(transformer_arch["vocab_size"])),
        use_native_flow_schedule=True, default_use_system_prompt=False,
        media={k: arch.architecture[k] for k in ("height", "width", "fps") if k in arch.architecture},
    )


def parameter_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
