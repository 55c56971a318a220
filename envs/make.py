"""A world-model env in the wrappers its keywords ask for: what ``worldstep.make_env`` and every sub-environment
of ``WorldModelVectorEnv`` are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from worldstep.engine.checks import check_int
from worldstep.engine.config import RolloutKnobs
from worldstep.engine.embodiment.action_normalizer import ActionNormalizer
from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel

from .world_model_env import DEFAULT_PROMPT, WorldModelEnv, check_model_and_knobs
from .wrappers.episode import JudgeSuccess, NormalizeActions, WindowLimit


def make_world_model_env(
    model: Cosmos3WorldModel,
    knobs: RolloutKnobs | None = None,
    *,
    max_windows: int | None = 32,
    prompt: str = DEFAULT_PROMPT,
    domain_id: int | None = None,
    image: np.ndarray | None = None,
    action_width: int | None = None,
    embodiment: str | int | None = None,
    fps: float | None = None,
    action_normalizer: ActionNormalizer | None = None,
    resolution_tier: int | str | None = None,
    simulator: str | None = None,
    reward_fn: Callable[[np.ndarray, np.ndarray], float] | None = None,
    success_fn: Callable[[np.ndarray], bool] | Literal["sim", "none"] | None = None,
    render_mode: str | None = None,
    observation: str = "frames",
) -> gym.Env:
    """``WindowLimit(JudgeSuccess(NormalizeActions(WorldModelEnv(...))))`` (``NormalizeActions`` only with an
    ``action_normalizer``; no ``WindowLimit`` with ``max_windows=None``: an outer ``TimeLimit`` counts the windows).
    ``embodiment``, ``domain_id``, ``action_width`` and ``fps`` are resolved by the engine, once, into the env's
    conditioning record (errors name the argument given); the rest are the env's and the wrappers' (``observation``:
    ``"frames"`` or ``"latents"``, see ``WorldModelEnv``)."""
    knobs = check_model_and_knobs(model, knobs, observation)
    if observation == "latents":  # the engine decodes nothing; the env's render() does
        knobs = knobs.model_copy(update={"decode": False})
    if max_windows is not None:
        check_int("max_windows", max_windows, 1)
    cond = model.conditioning(knobs, env_rule=True, embodiment=embodiment, domain_id=domain_id,
                              action_width=action_width, fps=fps)  # once: the env takes the record as it is
    env: Any = WorldModelEnv(model, knobs, embodiment=cond, prompt=prompt, image=image,
                             resolution_tier=resolution_tier, simulator=simulator, render_mode=render_mode)
    try:
        if action_normalizer is not None:
            env = NormalizeActions(env, action_normalizer)
        env = JudgeSuccess(env, success_fn, reward_fn)
        return env if max_windows is None else WindowLimit(env, max_windows)
    except BaseException:
        env.close()  # the simulator a judge looked up goes back
        raise
