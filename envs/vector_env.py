"""N world-model episodes stepped through one batched engine call per step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array
from worldstep.engine.checks import is_int
from worldstep.envs.batched import prepare, step_prepared
from worldstep.envs.episode import RESET_OPTION_KEYS, reset_request
from worldstep.envs.info import flat_records
from worldstep.envs.make import make_world_model_env


class WorldModelVectorEnv(VectorEnv):
    """``num_envs`` independent episodes of one loaded world model, batched per step.

    Each sub-environment is what ``worldstep.make_env`` builds from the same keywords (a :class:`WorldModelEnv`
    in its ``JudgeSuccess``, ``WindowLimit`` and, with an ``action_normalizer``, ``NormalizeActions`` wrappers),
    holding its own rollout session and RNG; they share the model's weights and KV page pool. ``step`` sends
    every live session through ONE ``model.step`` call (one batched forward per denoising step), between the
    halves of each sub-environment's wrappers (``worldstep.envs.batched``). Sub-environment ``i`` reset with
    seed ``s`` produces the frames a single ``WorldModelEnv`` reset with seed ``s`` produces, within
    float32 rounding: each session's attention and decoder calls are the ones it makes alone, but the
    linear layers run one GEMM over every session's tokens, which may round differently with the row
    count (latents within 1e-5, frames within 1 uint8 level; docs/exactness.md).

    ``autoreset_mode`` (an ``AutoresetMode`` or its value) says how a sub-environment that terminated or
    truncated starts its next episode, with the options of its last reset and a fresh draw from its RNG:

    * ``NEXT_STEP`` (default, gymnasium's): the next step resets it and ignores its action; that step returns
      the reset observation with reward 0 and neither flag set.
    * ``SAME_STEP`` (SB3's convention): the step that ends it resets it at once and returns the new episode's
      first observation; the last one and its info are in ``infos["final_obs"]`` / ``infos["final_info"]``.
    * ``DISABLED`` (what torchrl's ``GymWrapper`` takes: its reader of ``final_info`` under ``SAME_STEP`` cannot
      read the nested ``timings``/``kv`` infos): nothing resets on its own; ``reset(options={"reset_mask": mask})``
      resets the sub-environments where ``mask`` (a ``(num_envs,)`` bool array) is True and leaves the others
      running. Stepping one that ended without such a reset raises ``ResetNeeded`` naming it.

    ``reset(seed=s)`` seeds sub-environment ``i`` with ``s + i`` (or ``seed[i]`` for a list). Each
    ``options`` key (``image``, ``prompt``, ``domain_id``) takes one value for every sub-environment or a
    list/tuple of ``num_envs`` values. Infos are arrays with ``_key`` masks; ``timings`` holds float
    arrays ``denoise_s``, ``commit_s``, ``decode_s``, ``other_s`` and the int array ``shared_by``, and ``kv`` int
    arrays ``pages_in_use``, ... (the fields of a single env's ``PhaseTimings`` and ``KVStats``). Each env's
    timings are its share of the one batched engine call (the call's phases divided by the envs that shared
    it), so summed over the envs they give the call's phases and its wall time.

    With ``observation="latents"`` (an env keyword) every sub-environment observes its window's latents and the
    batched call decodes nothing; ``render()`` decodes each sub-environment's skipped windows on demand (each alone:
    within ``BATCHED_DECODE_ATOL`` of the frames a frames vector env with ``decoder.batch_sessions`` shows).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 6, "frame_fps": 24,
                "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, model, num_envs: int, knobs=None, *,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP, **env_kwargs: Any) -> None:
        if not is_int(num_envs) or num_envs < 1:
            raise ValueError(f"num_envs={num_envs!r} is invalid; allowed: an int >= 1")
        mode = check_autoreset_mode(autoreset_mode)
        self.num_envs = int(num_envs)
        self.envs = [make_world_model_env(model, knobs, **env_kwargs) for _ in range(self.num_envs)]
        self.model = model
        first = self.envs[0]
        self.render_mode = first.render_mode
        self.metadata = {**type(self).metadata, "render_fps": first.metadata["render_fps"],
                         "frame_fps": first.metadata["frame_fps"], "autoreset_mode": mode}
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._autoreset = np.zeros(self.num_envs, dtype=np.bool_)  # ended: the next step resets (or refuses)
        self._options: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self._observations: list[dict[str, np.ndarray]] = [  # the last observation of each, for a masked reset
            {key: np.zeros(box.shape, box.dtype) for key, box in self.single_observation_space.spaces.items()}
            for _ in range(self.num_envs)]

    @property
    def autoreset_mode(self) -> AutoresetMode:
        return self.metadata["autoreset_mode"]

    def reset(self, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None):
        """Reset every sub-environment, or with ``options["reset_mask"]`` those where the mask is True (the
        others keep their episodes; their observations come back unchanged and their infos empty)."""
        options = dict(options) if isinstance(options, dict) else options
        mask = self._reset_mask(options.pop("reset_mask")) if isinstance(options, dict) and "reset_mask" in options \
            else np.ones(self.num_envs, dtype=np.bool_)
        seeds = self._split_seed(seed)
        per_env = self._split_options(options)
        for i in np.flatnonzero(mask):  # every check before any session opens
            env, opts = self.envs[i].unwrapped, per_env[i]
            request = reset_request(opts, env.image, env.prompt, env.domain_id, self.model.spec.num_domains)
            env.rules.check_domain(request.domain_id)
            if request.image is not None:
                env.rules.check_frame(request.image, "options['image']")
        if mask.all():
            super().reset(seed=seeds[0])
        infos: dict[str, Any] = {}
        for i in np.flatnonzero(mask):
            self._observations[i], info = self.envs[i].reset(seed=seeds[i], options=per_env[i])
            self._options[i], self._autoreset[i] = per_env[i], False
            infos = self._add_info(infos, flat_records(info), i)
        return self._stack(self._observations), infos

    def step(self, actions: np.ndarray):
        actions = np.asarray(actions) if not hasattr(actions, "detach") else actions.detach().cpu().numpy()
        if actions.shape != self.action_space.shape:
            raise ValueError(f"actions.shape={actions.shape} is invalid; allowed: {self.action_space.shape} "
                             "(num_envs, chunk_size, action width)")
        mode = self.autoreset_mode
        if mode is AutoresetMode.DISABLED and self._autoreset.any():
            ended = np.flatnonzero(self._autoreset).tolist()
            raise gym.error.ResetNeeded(f"sub-environments {ended} ended and autoreset_mode is DISABLED; call "
                                        "reset(options={'reset_mask': mask}) with mask True there first")
        # each live episode is read once, here, before any autoreset: a concurrent close() cannot swap it away
        # mid-step, and a refused row (ResetNeeded, a normaliser's ValueError) raises before anything changes
        live = {i: prepare(self.envs[i], actions[i]) for i in range(self.num_envs) if not self._autoreset[i]}
        outcomes: dict[int, tuple] = {}
        for i in np.flatnonzero(self._autoreset):  # NEXT_STEP: this step is the reset
            obs, info = self.envs[i].reset(options=self._options[i])
            outcomes[i] = (obs, 0.0, False, False, info)
        outcomes.update(step_prepared(self.envs, actions, live, strict=True))  # one engine call

        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminations = np.zeros(self.num_envs, dtype=np.bool_)
        truncations = np.zeros(self.num_envs, dtype=np.bool_)
        infos: dict[str, Any] = {}
        observations = []
        for i in range(self.num_envs):
            obs, rewards[i], terminations[i], truncations[i], info = outcomes[i]
            if mode is AutoresetMode.SAME_STEP and (terminations[i] or truncations[i]):
                infos = self._add_info(infos, {"final_obs": obs, "final_info": flat_records(info)}, i)
                obs, info = self.envs[i].reset(options=self._options[i])
            observations.append(obs)
            infos = self._add_info(infos, flat_records(info), i)
        self._observations = observations
        self._autoreset = (terminations | truncations) & (mode is not AutoresetMode.SAME_STEP)
        return self._stack(observations), rewards, terminations, truncations, infos

    def render(self) -> tuple[np.ndarray | None, ...] | None:
        if self.render_mode is None:
            gym.logger.warn("You are calling render method without specifying any render mode.")
            return None
        return tuple(env.render() for env in self.envs)

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()

    # --- helpers ---------------------------------------------------------------------------

    def _reset_mask(self, mask: Any) -> np.ndarray:
        if not (isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and mask.shape == (self.num_envs,)
                and mask.any()):
            raise ValueError(f"options['reset_mask']={mask!r} is invalid; allowed: a numpy bool array of shape "
                             f"({self.num_envs},) with at least one True")
        return mask

    def _split_seed(self, seed) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if is_int(seed):
            return [int(seed) + i for i in range(self.num_envs)]
        if isinstance(seed, (list, tuple)) and len(seed) == self.num_envs and all(
            s is None or is_int(s) for s in seed
        ):
            return list(seed)
        raise ValueError(f"seed={seed!r} is invalid; allowed: None, an int, or a list of {self.num_envs} ints")

    def _split_options(self, options: dict[str, Any] | None) -> list[dict[str, Any]]:
        if options is None:
            return [{} for _ in range(self.num_envs)]
        if not isinstance(options, dict):
            raise ValueError(f"options={options!r} is invalid; allowed: a dict with keys {RESET_OPTION_KEYS}")
        first = self.envs[0].unwrapped  # unknown keys raise here, naming the allowed ones
        reset_request({k: None for k in options}, first.image, first.prompt, first.domain_id,
                      self.model.spec.num_domains)
        per_env: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for key in RESET_OPTION_KEYS:
            if key not in options:
                continue
            value = options[key]
            if isinstance(value, (list, tuple)):
                if len(value) != self.num_envs:
                    raise ValueError(
                        f"options[{key!r}] has {len(value)} values; allowed: one value or {self.num_envs} values"
                    )
                for opts, v in zip(per_env, value):
                    if v is not None:  # None: that sub-environment's default
                        opts[key] = v
            else:
                for opts in per_env:
                    opts[key] = value
        return per_env

    def _stack(self, observations: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        out = create_empty_array(self.single_observation_space, self.num_envs)
        return concatenate(self.single_observation_space, observations, out)


def check_autoreset_mode(mode: Any) -> AutoresetMode:
    """An ``AutoresetMode``, its value (``"SameStep"``) or its name in any case (``"same_step"``)."""
    if isinstance(mode, AutoresetMode):
        return mode
    for known in AutoresetMode:
        if isinstance(mode, str) and mode.lower() in (known.value.lower(), known.name.lower()):
            return known
    raise ValueError(f"autoreset_mode={mode!r} is invalid; allowed: "
                     f"{', '.join(repr(m.name.lower()) for m in AutoresetMode)} or an AutoresetMode")


