"""The `consistency` signal from the world model's own inverse dynamics, as SC3-Eval uses Cosmos3's: the window's
frames in (the previous window's last frame, then this window's), the actions that connect them out, compared
with the commanded actions. A model that drifts shows motion the commanded actions do not explain.

The residual is the mean absolute difference between the inferred and the commanded actions over the window,
in the model's normalised action space (the env's Box, [-1, 1] per dimension; 0: the frames show exactly the
commanded actions, 2: the largest possible gap). It is None when the model has no inverse dynamics.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

InverseModel = Callable[[np.ndarray], np.ndarray | None]
"""`clip` `[chunk + 1, H, W, 3]` uint8 -> the `[chunk, width]` actions connecting its frames (None: cannot tell)."""


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name}={value!r} is invalid; allowed: an int >= {low}")
    return int(value)


@dataclass(frozen=True)
class CosmosInverseDynamics:
    """A checkpoint's inverse dynamics on clips of decoded frames (`engine.models.cosmos3.inverse_dynamics`).

    Build it with `of_env`. The noise is seeded with `seed` on every call, so a window's answer depends on its
    frames alone (no history, repeatable).
    """

    components: Any = field(repr=False)  # the env's model's Cosmos3Components
    prompt: str
    query: Any  # ActionQuery: domain, raw width, fps
    caption_size: tuple[int, int]
    tier: int | None = None
    view_point: str = "ego_view"
    num_steps: int = 10
    guidance_scale: float = 1.0
    negative_prompt: str = ""
    seed: int = 0

    @classmethod
    def of_env(cls, env: Any, *, num_steps: int | None = None, guidance_scale: float = 1.0,
               seed: int = 0) -> CosmosInverseDynamics:
        """The inverse dynamics of a (made) Cosmos3 world-model env: its model, prompt, embodiment and frame size.

        Args:
            num_steps: UniPC steps (None: the env's knobs' `num_steps`).
            guidance_scale: text CFG (1.0: one stream, half the cost); >= 1.
            seed: the noise seed of every window.
        """
        from worldstep.engine.models.cosmos3.inverse_dynamics import ActionQuery

        base = env.unwrapped
        if not hasattr(base, "model") or not hasattr(base.model, "components") or not hasattr(base, "rules"):
            raise ValueError(f"env={env!r} is invalid; allowed: a Cosmos3 world-model env (worldstep.make_env)")
        knobs, cond, frame = base.knobs, base.conditioning, base.rules.frame
        steps = knobs.num_steps if num_steps is None else _check_int("num_steps", num_steps, 1)
        if isinstance(guidance_scale, bool) or not isinstance(guidance_scale, (int, float, np.number)) or \
                not math.isfinite(guidance_scale) or guidance_scale < 1:
            raise ValueError(f"guidance_scale={guidance_scale!r} is invalid; allowed: a number >= 1")
        _check_int("seed", seed, 0)
        return cls(base.model.components, base.prompt, ActionQuery(cond.domain_id, cond.action_width, cond.fps),
                   tuple(frame.caption_size), base.rules.tier, cond.view_point, steps, float(guidance_scale),
                   knobs.negative_prompt, int(seed))

    @property
    def available(self) -> bool:
        """Whether the checkpoint has an action head to infer actions with."""
        from worldstep.engine.models.cosmos3.inverse_dynamics import has_inverse_dynamics

        return has_inverse_dynamics(self.components.transformer)

    def __call__(self, clip: np.ndarray) -> np.ndarray | None:
        import torch
        from worldstep.engine.models.cosmos3.inverse_dynamics import clip_pixels, encode_clip, infer_actions
        from worldstep.engine.models.cosmos3.prompt import tokenize_action_prompt

        if not self.available:
            return None
        chunk = clip.shape[0] - 1
        pixels, plan = clip_pixels(clip, self.tier)
        latents = encode_clip(self.components.vae, pixels)  # [C, 1 + chunk // 4, h, w]
        if plan is not None:
            latents = plan.crop_latents(latents)
        ids = tokenize_action_prompt(self.components.tokenizer, self.prompt, self.negative_prompt,
                                     view_point=self.view_point, num_frames=chunk + 1, fps=self.query.fps,
                                     height=self.caption_size[0], width=self.caption_size[1],
                                     use_system_prompt=self.components.default_use_system_prompt)
        actions = infer_actions(self.components, latents, ids, self.query, chunk_size=chunk,
                                num_steps=self.num_steps, guidance_scale=self.guidance_scale,
                                generator=torch.Generator().manual_seed(self.seed))
        return actions.numpy()


class InverseDynamicsTracker:
    """A `Tracker` (`TrustSignalsWrapper(env, tracker=...)`): the mean |inferred - commanded| action of a window.

    Args:
        inverse: clip -> actions (`CosmosInverseDynamics.of_env(env)`, or any model's inverse dynamics).
        normalize: maps the actions the wrapper is stepped with to the model's normalised space (e.g. an
            `ActionNormalizer` when the wrapper sits outside `NormalizeActions`); None: they already are.
    """

    def __init__(self, inverse: InverseModel, *, normalize: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        if not callable(inverse):
            raise ValueError(f"inverse={inverse!r} is invalid; allowed: a callable clip -> actions")
        if normalize is not None and not callable(normalize):
            raise ValueError(f"normalize={normalize!r} is invalid; allowed: None or a callable actions -> actions")
        self.inverse, self.normalize = inverse, normalize

    @classmethod
    def for_env(cls, env: Any, *, normalize: Callable[[np.ndarray], np.ndarray] | None = None,
                **knobs: Any) -> InverseDynamicsTracker:
        """The tracker of a Cosmos3 world-model env's own inverse dynamics (`CosmosInverseDynamics.of_env`)."""
        return cls(CosmosInverseDynamics.of_env(env, **knobs), normalize=normalize)

    def residual(self, previous_frame: np.ndarray, frames: np.ndarray, actions: np.ndarray) -> float | None:
        frames = np.asarray(frames)
        clip = np.concatenate([np.asarray(previous_frame)[None], frames])  # [chunk + 1, H, W, 3]
        inferred = self.inverse(clip)
        if inferred is None:
            return None
        commanded = np.asarray(actions if self.normalize is None else self.normalize(actions), dtype=np.float64)
        inferred = np.asarray(inferred, dtype=np.float64)
        if inferred.shape != commanded.shape:
            raise ValueError(f"actions of shape {commanded.shape} are invalid; allowed: {inferred.shape} (the "
                             "inferred actions' shape)")
        return float(np.mean(np.abs(inferred - commanded)))
