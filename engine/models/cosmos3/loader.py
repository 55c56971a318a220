"""Read a Cosmos3 checkpoint in the diffusers layout: `transformer/`, `vae/`, `scheduler/`, `text_tokenizer/`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...devices import canonical_device
from ...spec import ModelSpec

_REQUIRED = ("transformer", "vae", "scheduler", "text_tokenizer")


class CheckpointNotFoundError(FileNotFoundError):
    """The checkpoint is not on disk (or not in the offline hub cache); the message says where we looked."""


@dataclass
class Cosmos3Components:
    """The loaded modules plus the pipeline flags that change how a window is built."""

    path: Path
    transformer: Any  # diffusers Cosmos3OmniTransformer
    vae: Any  # diffusers AutoencoderKLWan
    unipc_config: dict[str, Any]  # the checkpoint's scheduler/scheduler_config.json (UniPC's noise schedule)
    tokenizer: Any
    use_native_flow_schedule: bool = True
    default_use_system_prompt: bool = False
    media: dict[str, Any] = field(default_factory=dict)  # height/width/fps recorded by our builder


def resolve_checkpoint(path_or_id: str | os.PathLike) -> Path:
    """A local folder, or a hub id found in the local hub cache (downloaded when the hub is reachable)."""
    local = Path(path_or_id).expanduser()
    if local.is_dir():
        _check_layout(local)
        return local
    looked = [str(local.resolve())]
    text = str(path_or_id)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        from huggingface_hub import snapshot_download
        from huggingface_hub.constants import HF_HUB_CACHE, HF_HUB_OFFLINE

        looked.append(f"hub cache {HF_HUB_CACHE} for '{text}'")
        try:
            folder = Path(snapshot_download(text, local_files_only=HF_HUB_OFFLINE))
        except Exception as err:  # noqa: BLE001 - every hub failure means "not available here"
            raise CheckpointNotFoundError(_missing_message(text, looked, err)) from err
        _check_layout(folder)
        return folder
    raise CheckpointNotFoundError(_missing_message(text, looked, None))


def _missing_message(what: str, looked: list[str], err: Exception | None) -> str:
    reason = f" ({type(err).__name__}: {err})" if err is not None else ""
    return (
        f"Cosmos3 checkpoint '{what}' not found{reason}. Looked in: {'; '.join(looked)}. "
        "Get the weights with `huggingface-cli download nvidia/Cosmos3-Edge --local-dir PATH` on a machine "
        "with access, then pass PATH (a folder with transformer/, vae/, scheduler/, text_tokenizer/), or set "
        "HF_HUB_OFFLINE=1 with the weights in the local hub cache."
    )


def _check_layout(folder: Path) -> None:
    missing = [name for name in _REQUIRED if not (folder / name).is_dir()]
    if missing:
        raise CheckpointNotFoundError(
            f"'{folder}' is not a Cosmos3 checkpoint in the diffusers layout: missing {', '.join(missing)}/ "
            f"(expected {', '.join(n + '/' for n in _REQUIRED)})."
        )


def default_dtype(device: torch.device | str) -> torch.dtype:
    """bf16 on CUDA (what Cosmos3 is trained and served in), fp32 elsewhere."""
    return torch.bfloat16 if canonical_device(device).type == "cuda" else torch.float32


def load_components(
    path_or_id: str | os.PathLike,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    vae_dtype: torch.dtype | None = None,
) -> Cosmos3Components:
    """Load every module the rollout needs; the transformer in `dtype` (default: bf16 on CUDA, fp32 on
    CPU), the VAE in `vae_dtype` (default fp32, so frames match one whole-stream decode exactly)."""
    from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer
    from transformers import AutoTokenizer

    folder = resolve_checkpoint(path_or_id)
    transformer = Cosmos3OmniTransformer.from_pretrained(
        folder / "transformer", torch_dtype=dtype or default_dtype(device)
    )
    vae = AutoencoderKLWan.from_pretrained(folder / "vae", torch_dtype=vae_dtype or torch.float32)
    transformer.to(device).eval().requires_grad_(False)
    vae.to(device).eval().requires_grad_(False)
    unipc_config = json.loads((folder / "scheduler" / "scheduler_config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(folder / "text_tokenizer")
    index = _read_json(folder / "model_index.json")
    return Cosmos3Components(
        path=folder,
        transformer=transformer,
        vae=vae,
        unipc_config=unipc_config,
        tokenizer=tokenizer,
        use_native_flow_schedule=bool(index.get("use_native_flow_schedule", True)),
        default_use_system_prompt=bool(index.get("default_use_system_prompt", False)),
        media=_read_json(folder / "worldstep.json"),
    )


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


_DEFAULT_MEDIA = {"height": 480, "width": 832, "fps": 24.0}


def model_spec(components: Cosmos3Components, *, height: int | None = None, width: int | None = None,
               fps: float | None = None, name: str | None = None) -> ModelSpec:
    """What the loaded checkpoint produces and accepts at ``height x width`` (the checkpoint's own media size
    and fps, else Cosmos3-Edge's 480p tier at 24 fps, when not given)."""
    media = {**_DEFAULT_MEDIA, **components.media}
    height, width = int(height or media["height"]), int(width or media["width"])
    t_config, v_config = components.transformer.config, components.vae.config
    spatial = int(v_config.scale_factor_spatial)
    if height % spatial or width % spatial:
        raise ValueError(f"height={height}, width={width} are invalid; allowed: multiples of {spatial}")
    latent_h, latent_w = height // spatial, width // spatial
    patch = int(t_config.latent_patch_size)
    grid = (-(-latent_h // patch), -(-latent_w // patch))
    return ModelSpec(
        name=name or components.path.name, height=height, width=width, fps=float(fps or media["fps"]),
        action_dim=int(t_config.action_dim), num_domains=int(t_config.num_embodiment_domains),
        latent_channels=int(t_config.latent_channel), latent_height=latent_h, latent_width=latent_w,
        tokens_per_frame=grid[0] * grid[1], patch_grid=grid,
        temporal_compression=int(v_config.scale_factor_temporal), spatial_compression=spatial,
    )
