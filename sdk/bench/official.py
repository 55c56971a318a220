"""The baseline a user would otherwise write: NVIDIA's autoregressive forward-dynamics recipe.

Each chunk is one `Cosmos3OmniPipeline` forward-dynamics call conditioned on the LAST GENERATED FRAME. The
pipeline builds a `chunk_size + 1`-frame clip of that frame and VAE-encodes all of it, denoises the whole
clip (prompt, clean frame, the chunk's latents, actions: the text pathway runs at every step), decodes the
whole clip (the conditioning latent again), and the caller keeps the chunk's new frames and takes the last
one as the next chunk's image. It loads from the same checkpoint folder as worldstep, so both run on
identical weights, scheduler and prompt template; on a GPU (`bench gpu`) it wraps the very modules worldstep
runs (`pipeline_from_components`), since Edge is built in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .archs import DOMAIN_NAME
from .measure import SyncedStopwatch, device_sync


class _PhaseClock:
    """Wraps `vae.encode` / `vae.decode` of one pipeline to add up the (wall, CPU) seconds spent in each.

    On CUDA a call returns once its kernels are queued, so each phase is timed between two synchronizes of the
    VAE's device (`SyncedStopwatch`): the H200's first run reported the host's 319 ms to queue the recipe's
    decode as its decode time.
    """

    def __init__(self, vae, sync: Callable[[], None] | None = None) -> None:
        self.seconds = {"encode": (0.0, 0.0), "decode": (0.0, 0.0)}
        self.sync = sync or device_sync(next(vae.parameters()).device)
        for name in self.seconds:
            self._wrap(vae, name)

    def _wrap(self, vae, name: str) -> None:
        inner = getattr(vae, name)

        def timed(*args, **kwargs):
            watch = SyncedStopwatch(self.sync)
            try:
                return inner(*args, **kwargs)
            finally:
                wall, cpu = watch.elapsed()
                total = self.seconds[name]
                self.seconds[name] = (total[0] + wall, total[1] + cpu)

        setattr(vae, name, timed)  # instance attribute: this pipeline's VAE only

    def remove(self, vae) -> None:
        """Take the wrappers off (the VAE may be shared with a worldstep model)."""
        for name in self.seconds:
            vae.__dict__.pop(name, None)


class OfficialRecipe:
    """Chunk-by-chunk forward dynamics with `Cosmos3OmniPipeline`, re-encoding the last frame each chunk.

    `worldstep_kernels`: the pipeline's own VAE (loaded for this recipe alone) is replaced by its copy with
    worldstep's CPU decoder fast path (`engine/vae/perf.py`: oneDNN 3-D convs, fused RMS norm), applied to the
    whole VAE, encoder included, so that the recipe and worldstep run the same kernels.
    """

    def __init__(self, checkpoint: str | Path | Any, *, image: np.ndarray, prompt: str, chunk_size: int, num_steps: int,
                 worldstep_kernels: bool = False, seed: int = 0) -> None:
        """`checkpoint`: a checkpoint folder, or a built `Cosmos3OmniPipeline` (`pipeline_from_components`)."""
        from diffusers import Cosmos3OmniPipeline

        if isinstance(checkpoint, (str, Path)):
            checkpoint = Cosmos3OmniPipeline.from_pretrained(checkpoint)
        self.pipeline = checkpoint
        self.pipeline.set_progress_bar_config(disable=True)
        if worldstep_kernels:
            from worldstep.engine.vae.perf import decoder_copy

            self.pipeline.vae = decoder_copy(self.pipeline.vae, onednn_conv=True)
        self.clock = _PhaseClock(self.pipeline.vae)
        self.frame = np.asarray(image, dtype=np.uint8)
        self.prompt, self.chunk_size, self.num_steps = prompt, chunk_size, num_steps
        self.generator = torch.Generator().manual_seed(seed)
        self.tier = canvas_tier(self.frame.shape[0], self.frame.shape[1])

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, dict[str, tuple[float, float]]]:
        """One chunk: the chunk's `chunk_size` new frames, uint8 `[T, H, W, 3]`, and its (wall, CPU) seconds in
        `generate` (the pipeline call minus its VAE), `encode` and `decode`."""
        before = dict(self.clock.seconds)
        watch = SyncedStopwatch(self.clock.sync)
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
        from PIL import Image

        condition = CosmosActionCondition(
            mode="forward_dynamics", chunk_size=self.chunk_size, domain_name=DOMAIN_NAME,
            resolution_tier=self.tier, raw_actions=torch.from_numpy(np.ascontiguousarray(actions)),
            # A PIL image: the pipeline's numpy path skips the /255 of uint8 input.
            image=Image.fromarray(self.frame),
        )
        video = self.pipeline(
            prompt=self.prompt, negative_prompt="", action=condition, num_inference_steps=self.num_steps,
            guidance_scale=1.0, output_type="np", generator=self.generator, enable_safety_check=False,
        ).video  # [chunk + 1, H, W, 3] float in [0, 1]
        total = watch.elapsed()
        frames = (np.asarray(video) * 255.0).round().clip(0, 255).astype(np.uint8)
        self.frame = frames[-1]
        phases = {name: (after[0] - before[name][0], after[1] - before[name][1])
                  for name, after in self.clock.seconds.items()}
        phases["generate"] = (total[0] - phases["encode"][0] - phases["decode"][0],
                              total[1] - phases["encode"][1] - phases["decode"][1])
        return frames[1:], phases


def pipeline_from_components(components):
    """A `Cosmos3OmniPipeline` over a loaded model's own modules (shared, not copied)."""
    from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler

    return Cosmos3OmniPipeline(
        transformer=components.transformer, text_tokenizer=components.tokenizer, vae=components.vae,
        scheduler=UniPCMultistepScheduler.from_config(components.unipc_config), enable_safety_checker=False,
        default_use_system_prompt=components.default_use_system_prompt,
        use_native_flow_schedule=components.use_native_flow_schedule,
    )


def canvas_tier(height: int, width: int) -> int:
    """The resolution tier whose canvas is exactly `height` x `width`.

    Any other frame size would be padded up to a canvas by the pipeline, and the baseline would do
    more work than worldstep for the same frames: the comparison refuses it.
    """
    from worldstep.engine.models.cosmos3.canvas import resolution_bins

    bins = resolution_bins()
    for tier, sizes in bins.items():
        if (height, width) in sizes.values():
            return tier
    canvases = sorted({hw for sizes in bins.values() for hw in sizes.values()})
    raise ValueError(f"frame size {height}x{width} is invalid for the official recipe; allowed: a pipeline "
                     f"canvas, one of {canvases}")
