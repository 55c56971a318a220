"""Random-weight Cosmos3 checkpoints in the real diffusers layout.

The embedded default model and the test fixtures are built here, saved with
`Cosmos3OmniPipeline.save_pretrained` (so `transformer/`, `vae/`, `scheduler/`, `text_tokenizer/` and
`model_index.json` are exactly what diffusers writes for the real model), and then read back by the
same loader a real checkpoint goes through. A full-size model (Edge: 15 GiB in fp32) is built in memory instead
(`build_pipeline(..., in_place=True)`, `components_of`), never written.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .architecture import Cosmos3Architecture
from .loader import Cosmos3Components

# Characters the embedded tokenizer knows; anything else maps to <unk>.
_ALPHABET = [chr(c) for c in range(32, 127)] + ["\n"]
_TRIPLE_STRIDE = 7919  # a prime, so coprime to len(_ALPHABET) ** 3 = 2**15 * 3**3
_SPECIAL_TOKENS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>"]
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
    '{"cinematography": {"framing": "This video is captured from a first-person perspective looking at the scene."},'
    ' "actions": [{"time": "0:00-0:01", "description": "A robot arm pushes a block across a table."}],'
    ' "duration": "1s", "fps": 24.0, "resolution": {"H": 128, "W": 128}, "aspect_ratio": "1,1"}',
    "pick up the red cube and place it in the bowl. the robot moves the gripper to the left.",
    "user assistant system robot arm gripper block table scene video camera wrist view third person",
]
# Scheduler settings of the Cosmos3 action pipeline (UniPC, flow prediction, bh2, order 2).
SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "flow_shift": 5.0,
    "solver_order": 2,
    "solver_type": "bh2",
    "predict_x0": True,
    "lower_order_final": True,
    "final_sigmas_type": "zero",
}


def build_tokenizer(vocab_size: int, *, exact: bool = False):
    """A small character-level BPE tokenizer with the Qwen-style chat template and special tokens.

    Training on the small corpus stops after a few hundred entries; with ``exact`` the vocabulary is then
    filled with character pairs and triples up to exactly ``vocab_size`` entries (a full-size model's
    vocabulary: every row of the embedding table is a token); the trained tokens keep their ids.
    """
    from tokenizers import Tokenizer, models, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < len(_ALPHABET) + len(_SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size={vocab_size} is too small for the embedded tokenizer; "
            f"allowed range: >= {len(_ALPHABET) + len(_SPECIAL_TOKENS)}"
        )
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=_SPECIAL_TOKENS, initial_alphabet=_ALPHABET, show_progress=False
    )
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    if exact:
        tokenizer = _filled_to(tokenizer, vocab_size)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>", "<|vision_start|>"],
    )
    fast.chat_template = _CHAT_TEMPLATE
    return fast


def _filled_to(tokenizer, vocab_size: int):
    """``tokenizer`` with BPE merges of character n-grams appended until its vocabulary has ``vocab_size``
    entries: every pair, then a pair plus a character, the triples taken in a strided order so the ones a
    prompt contains are spread over the whole id range (enough for any vocabulary up to ~890k)."""
    from tokenizers import Tokenizer

    state = json.loads(tokenizer.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    merges: list = state["model"]["merges"]
    n = len(_ALPHABET)
    pairs = ((a, b) for a in _ALPHABET for b in _ALPHABET)
    strided = ((i * _TRIPLE_STRIDE) % n**3 for i in range(n**3))  # a permutation: the stride is coprime to n**3
    triples = ((_ALPHABET[i // n**2] + _ALPHABET[i // n % n], _ALPHABET[i % n]) for i in strided)
    for left, right in itertools.chain(pairs, triples):
        if len(vocab) >= vocab_size:
            break
        if left + right not in vocab:
            vocab[left + right] = len(vocab)
            merges.append([left, right])
    if len(vocab) != vocab_size:
        raise ValueError(f"vocab_size={vocab_size} is invalid for the embedded tokenizer; allowed: <= {len(vocab)}")
    return Tokenizer.from_str(json.dumps(state))


def _vae_kwargs(vae_arch: dict[str, Any], generator: torch.Generator) -> dict[str, Any]:
    """VAE constructor kwargs; random but fixed latent statistics when the block gives none."""
    kwargs = dict(vae_arch)
    z_dim = int(kwargs["z_dim"])
    if "latents_mean" not in kwargs:
        kwargs["latents_mean"] = (torch.randn(z_dim, generator=generator) * 0.1).tolist()
    if "latents_std" not in kwargs:
        kwargs["latents_std"] = (torch.rand(z_dim, generator=generator) * 0.5 + 0.75).tolist()
    return kwargs


def _randomize_(module: torch.nn.Module, generator: torch.Generator, std: float = 0.05) -> None:
    """Give every parameter small random values (diffusers inits some heads to zero, which hides bugs)."""
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("weight") and "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
            else:
                param.copy_(std * torch.randn(param.shape, generator=generator))


def _fill_in_place_(module: torch.nn.Module, generator: torch.Generator, std: float) -> None:
    """`_randomize_`'s distribution, with each parameter allocated once (from the meta device) and drawn where
    it lies: no default initialisation and no temporary copy, so building peaks at the weights' own size.
    The values differ from `_randomize_`'s (same distribution, other draws)."""
    with torch.no_grad():
        for prefix, sub in module.named_modules():
            for name, param in list(sub.named_parameters(recurse=False)):
                tensor = torch.empty(param.shape, dtype=param.dtype)
                if name.endswith("weight") and "norm" in f"{prefix}.{name}":
                    tensor.normal_(1.0, 0.1, generator=generator)
                else:
                    tensor.normal_(0.0, std, generator=generator)
                setattr(sub, name, torch.nn.Parameter(tensor, requires_grad=param.requires_grad))


def _random_modules(architecture: Cosmos3Architecture, generator: torch.Generator, in_place: bool):
    """The transformer and VAE of ``architecture`` with random weights (see `build_pipeline`)."""
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer

    if not in_place:
        transformer = Cosmos3OmniTransformer(**architecture.transformer)
        _randomize_(transformer, generator)
        vae = AutoencoderKLWan(**_vae_kwargs(architecture.vae, generator))
        _randomize_(vae, generator, std=0.1)
        return transformer, vae
    with init_empty_weights(include_buffers=False):  # parameters on meta; buffers (rotary inv_freq) real
        transformer = Cosmos3OmniTransformer(**architecture.transformer)
    _fill_in_place_(transformer, generator, std=0.05)
    with init_empty_weights(include_buffers=False):
        vae = AutoencoderKLWan(**_vae_kwargs(architecture.vae, generator))
    _fill_in_place_(vae, generator, std=0.1)
    return transformer, vae


def build_pipeline(architecture: Cosmos3Architecture | Mapping[str, Any], seed: int = 0, *,
                   in_place: bool = False, exact_vocab: bool = False):
    """An in-memory `Cosmos3OmniPipeline` with random weights shaped by ``architecture``.

    ``in_place``: allocate each parameter once and draw it where it lies (`_fill_in_place_`), the way a
    full-size model (Edge: 3.4 B transformer + 0.7 B VAE parameters, 15 GiB in fp32) fits a small host;
    other values than the default build. ``exact_vocab``: a tokenizer with exactly the transformer's
    ``vocab_size`` entries (`build_tokenizer`).
    """
    from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler

    architecture = Cosmos3Architecture.of(architecture)  # checked before any weights are made
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    transformer, vae = _random_modules(architecture, generator, in_place)
    scheduler = UniPCMultistepScheduler(**SCHEDULER_CONFIG)
    tokenizer = build_tokenizer(int(architecture.transformer["vocab_size"]), exact=exact_vocab)
    return Cosmos3OmniPipeline(
        transformer=transformer,
        text_tokenizer=tokenizer,
        vae=vae,
        scheduler=scheduler,
        enable_safety_checker=False,
        **architecture.pipeline.model_dump(),
    )


def components_of(pipeline, architecture: Cosmos3Architecture | Mapping[str, Any]) -> Cosmos3Components:
    """`Cosmos3Components` holding the SAME transformer, VAE and tokenizer objects as ``pipeline`` (nothing
    copied), so an in-memory model and the diffusers pipeline run one set of weights."""
    architecture = Cosmos3Architecture.of(architecture)
    pipeline.transformer.eval().requires_grad_(False)
    pipeline.vae.eval().requires_grad_(False)
    return Cosmos3Components(
        path=Path("<in-memory>"), transformer=pipeline.transformer, vae=pipeline.vae,
        unipc_config=dict(pipeline.scheduler.config), tokenizer=pipeline.text_tokenizer,
        use_native_flow_schedule=architecture.pipeline.use_native_flow_schedule,
        default_use_system_prompt=architecture.pipeline.default_use_system_prompt, media=architecture.media,
    )


def build_checkpoint(path: str | os.PathLike, architecture: Cosmos3Architecture | Mapping[str, Any],
                     seed: int = 0) -> Path:
    """Write a random-weight checkpoint in the diffusers layout to `path` and return it."""
    path = Path(path)
    architecture = Cosmos3Architecture.of(architecture)
    pipeline = build_pipeline(architecture, seed=seed)
    pipeline.save_pretrained(path, safe_serialization=True)
    (path / "worldstep.json").write_text(json.dumps({"seed": seed, **architecture.media}, indent=2))
    return path


def _cache_root(cache_dir: str | os.PathLike | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get("WORLDSTEP_CACHE", Path.home() / ".cache" / "worldstep"))


def ensure_embedded_checkpoint(name: str, architecture: Cosmos3Architecture | Mapping[str, Any],
                               cache_dir: str | os.PathLike | None = None, seed: int = 0) -> Path:
    """Build an embedded model's checkpoint once (keyed by its architecture) and return its folder."""
    architecture = Cosmos3Architecture.of(architecture)
    key = [architecture.model_dump(mode="json"), seed]
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    target = _cache_root(cache_dir) / "models" / f"{name}-{digest}"
    if (target / "model_index.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build_checkpoint(staging, architecture, seed=seed)
        try:
            staging.rename(target)
        except OSError:  # another process built it first
            if not (target / "model_index.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
