"""The baseline a user would otherwise write: NVIDIA's autoregressive forward-dynamics recipe.

Each chunk is one `Cosmos3OmniPipeline` forward-dynamics call conditioned on the LAST GENERATED
FRAME: the pipeline encodes that frame, denoises the whole clip (prompt, clean frame, window
latents, actions: the text pathway runs at every step), decodes the whole clip, and the caller
takes its last frame as the next chunk's image. It loads from the same checkpoint folder as
worldstep, so both run on identical weights, scheduler and prompt template; on a GPU (`bench gpu`) it
wraps the very modules worldstep runs (`pipeline_from_components`), since Edge is built in memory.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .archs import DOMAIN_NAME


class _PhaseClock:
    """Wraps `vae.encode` / `vae.decode` of one pipeline to add up the seconds spent in each."""

    def __init__(self, vae) -> None:
        self.encode_s = 0.0
        self.decode_s = 0.0
        self._wrap(vae, "encode")
        self._wrap(vae, "decode")

    def _wrap(self, vae, name: str) -> None:
        inner = getattr(vae, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                setattr(self, f"{name}_s", getattr(self, f"{name}_s") + time.perf_counter() - start)

        setattr(vae, name, timed)  # instance attribute: this pipeline's VAE only

    def remove(self, vae) -> None:
        """Take the wrappers off (the VAE may be shared with a worldstep model)."""
        for name in ("encode", "decode"):
            vae.__dict__.pop(name, None)


class OfficialRecipe:
    """Chunk-by-chunk forward dynamics with `Cosmos3OmniPipeline`, re-encoding the last frame each chunk."""

    def __init__(self, checkpoint: str | Path | Any, *, image: np.ndarray, prompt: str, chunk_size: int,
                 num_steps: int, guidance_scale: float = 1.0, negative_prompt: str = "", seed: int = 0) -> None:
        """`checkpoint`: a checkpoint folder, or a built `Cosmos3OmniPipeline` (`pipeline_from_components`)."""
        from diffusers import Cosmos3OmniPipeline

        if isinstance(checkpoint, (str, Path)):
            checkpoint = Cosmos3OmniPipeline.from_pretrained(checkpoint)
        self.pipeline = checkpoint
        self.pipeline.set_progress_bar_config(disable=True)
        self.clock = _PhaseClock(self.pipeline.vae)
        self.frame = np.asarray(image, dtype=np.uint8)
        self.prompt, self.negative_prompt = prompt, negative_prompt
        self.chunk_size, self.num_steps, self.guidance_scale = chunk_size, num_steps, guidance_scale
        self.generator = torch.Generator().manual_seed(seed)
        self.tier = _tier(self.frame.shape[0], self.frame.shape[1])

    def step(self, actions: np.ndarray) -> np.ndarray:
        """One chunk: returns the chunk's `chunk_size` new frames, uint8 `[T, H, W, 3]`."""
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
        from PIL import Image

        condition = CosmosActionCondition(
            mode="forward_dynamics", chunk_size=self.chunk_size, domain_name=DOMAIN_NAME,
            resolution_tier=self.tier, raw_actions=torch.from_numpy(np.ascontiguousarray(actions)),
            # A PIL image: the pipeline's numpy path skips the /255 of uint8 input.
            image=Image.fromarray(self.frame),
        )
        video = self.pipeline(
            prompt=self.prompt, negative_prompt=self.negative_prompt, action=condition,
            num_inference_steps=self.num_steps, guidance_scale=self.guidance_scale, output_type="np",
            generator=self.generator, enable_safety_check=False,
        ).video  # [chunk + 1, H, W, 3] float in [0, 1]
        frames = (np.asarray(video) * 255.0).round().clip(0, 255).astype(np.uint8)
        self.frame = frames[-1]
        return frames[1:]


def pipeline_from_components(components):
    """A `Cosmos3OmniPipeline` over a loaded model's own modules (shared, not copied)."""
    from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler

    return Cosmos3OmniPipeline(
        transformer=components.transformer, text_tokenizer=components.tokenizer, vae=components.vae,
        scheduler=UniPCMultistepScheduler.from_config(components.scheduler_config), enable_safety_checker=False,
        default_use_system_prompt=components.default_use_system_prompt,
        use_native_flow_schedule=components.use_native_flow_schedule,
    )


def _tier(height: int, width: int) -> int:
    """The resolution tier whose canvas is exactly `height` x `width`.

    Any other frame size would be padded up to a canvas by the pipeline, and the baseline would do
    more work than worldstep for the same frames: the comparison refuses it.
    """
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _ACTION_RESOLUTION_BINS

    for tier, bins in _ACTION_RESOLUTION_BINS.items():
        if (height, width) in bins.values():
            return int(tier)
    canvases = sorted({hw for bins in _ACTION_RESOLUTION_BINS.values() for hw in bins.values()})
    raise ValueError(f"frame size {height}x{width} is invalid for the official recipe; allowed: a pipeline "
                     f"canvas, one of {canvases}")
