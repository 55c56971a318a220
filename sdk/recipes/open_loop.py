"""Open loop: recorded actions through the model from given first frames, every clip a batched session, and the
recipe (prompt, embodiment, knobs) it rolls out with. Replay and the fidelity report use it alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from worldstep.engine.config import RolloutKnobs


@dataclass(frozen=True)
class RolloutRecipe:
    """How the report rolls the model out: the prompt, the embodiment and the engine's `RolloutKnobs`
    (each run sets its own ``window_mode``)."""

    prompt: str
    domain_id: int
    knobs: RolloutKnobs

    @property
    def chunk_size(self) -> int:
        return self.knobs.chunk_size

    def knobs_for(self, mode: str) -> RolloutKnobs:
        return self.knobs.replace(window_mode=mode)

    def to_dict(self) -> dict[str, Any]:
        """The prompt, domain and every knob (the report's ``settings``)."""
        return {"prompt": self.prompt, "domain_id": self.domain_id, **self.knobs.model_dump()}


def open_loop(world, first_frames: np.ndarray, actions: np.ndarray, recipe: RolloutRecipe, mode: str,
              seeds: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Model frames `[N, W*chunk, H, W, 3]` for first frames `[N, H, W, 3]` and actions `[N, W*chunk, 2]`,
    and each session's decoded first frame `[N, H, W, 3]` (the VAE round trip of the given one); clip i's
    diffusion noise is seeded by `seeds[i]`."""
    chunk = recipe.chunk_size
    windows = actions.shape[1] // chunk
    sessions = [world.open_session(frame, recipe.prompt, recipe.domain_id, knobs=recipe.knobs_for(mode),
                                   generator=torch.Generator().manual_seed(seed), action_width=actions.shape[-1])
                for frame, seed in zip(first_frames, seeds)]
    out = []
    try:
        for w in range(windows):
            results = world.step(sessions, [a[w * chunk:(w + 1) * chunk] for a in actions])
            out.append(np.stack([r.frames for r in results]))
        decoded_first = np.stack([s.first_frame for s in sessions])
    finally:
        for s in sessions:
            world.close(s)
    return np.concatenate(out, axis=1), decoded_first
