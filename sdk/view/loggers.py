"""Wrappers that show a rollout live: ``RerunLogger`` logs every window into a Rerun recording.

```python
import gymnasium as gym, rerun as rr, worldstep
from worldstep.view.loggers import RerunLogger

recording = rr.RecordingStream("worldstep")
recording.save("run.rrd")                     # or .spawn(), or worldstep.view.viewer.open_viewer(serve=...)
env = RerunLogger(gym.make("worldstep/Pusher-v0"), recording)
```

Needs the ``view`` extra (``pip install 'worldstep[view]'``, rerun-sdk).

They live with the SDK's viewer (``worldstep.view``), which they need; every other wrapper of a world-model env
(the env's own frames, recording, image observations, forks) is in ``worldstep.envs.wrappers``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper
from worldstep.engine.checks import is_int

from .rerun_log import IMAGE_FORMATS, ImageFormat, RolloutLog, rerun_module

__all__ = ["RerunLogger", "RerunVectorLogger"]


class RerunLogger(gym.Wrapper):
    """Log each window of an env to Rerun on one (window, frame) timeline, as it is stepped.

    Logged per window (entity paths in ``worldstep.view.rerun_log``): every frame (JPEG, or PNG with
    ``image_format="png"``), each action dimension as a scalar series named from the embodiment, reward,
    success, KV pages in use and the window's phase timings (``info["kv"]``, ``info["timings"]``), and with
    ``truth`` the simulator's frames and the window's mean PSNR against them.

    Works for any env whose observations hold uint8 ``frames`` of shape ``(chunk, H, W, 3)`` and whose actions
    are ``(chunk, width)``: the world-model env, the simulator, a remote env. Given a gymnasium ``VectorEnv``,
    ``RerunLogger(env, ...)`` returns a :class:`RerunVectorLogger` (one entity root per env index).

    Args:
        env: the env to log.
        recording: a ``rerun.RecordingStream`` (its sinks decide where the data goes: a file, a viewer, the
            served web viewer); None takes the global recording ``rr.init`` made, else a new one, which holds
            the data in memory until a sink is set.
        truth: a simulator stepped beside ``env`` with the same actions (reset with ``info["scene_seed"]``
            when the env reports one); its frames and each window's PSNR are logged, and ``info`` gains
            ``truth_psnr_db``.
        embodiment: names the action series (default: ``env.unwrapped.embodiment`` when it has one).
        image_format: ``"jpeg"`` (bounded size, lossy) or ``"png"`` (lossless).
        jpeg_quality: 1..100.
        entity: the entity root (default ``"env"``).
    """

    def __new__(cls, env: Any, *args: Any, **kwargs: Any):
        if cls is RerunLogger and isinstance(env, VectorEnv):
            return RerunVectorLogger(env, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, env: gym.Env, recording: Any = None, *, truth: gym.Env | None = None,
                 embodiment: str | None = None, image_format: ImageFormat = "jpeg", jpeg_quality: int = 90,
                 entity: str = "env") -> None:
        if not isinstance(env, gym.Env):
            raise TypeError(f"env={env!r} is invalid; allowed: a gymnasium.Env or gymnasium.vector.VectorEnv")
        chunk, width = _check_spaces(env.observation_space, env.action_space, "env")
        if truth is not None:
            if not isinstance(truth, gym.Env):
                raise TypeError(f"truth={truth!r} is invalid; allowed: None or a gymnasium.Env")
            if _check_spaces(truth.observation_space, truth.action_space, "truth") != (chunk, width):
                raise ValueError(f"truth's action space {truth.action_space.shape} is invalid; allowed: the env's "
                                 f"{env.action_space.shape}")
        recording = _check_options(recording, embodiment, image_format, jpeg_quality, entity)
        super().__init__(env)
        self.recording = recording
        self.truth = truth
        self.chunk_size = chunk
        name = embodiment if embodiment is not None else getattr(env.unwrapped, "embodiment", None)
        self.log = RolloutLog(recording, entity, name, width, image_format, jpeg_quality)
        self._window = 0  # the next window's index (the env's info["window_index"] wins when it has one)
        self._frame_start = 1

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._window, self._frame_start = 0, 1
        self.log.reset(obs["frames"][0], info.get("kv"))
        if self.truth is not None:
            truth_obs, _ = self.truth.reset(seed=info.get("scene_seed", seed))
            self.log_truth(truth_obs["frames"][:1])
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if info.get("kv_exhausted", False):  # the window produced no frames
            return obs, reward, terminated, truncated, info
        window = int(info.get("window_index", self._window))
        frame_start = int(info.get("frame_start", self._frame_start))
        success = info.get("is_success", info.get("success", terminated))
        self.log.window(window, frame_start, obs["frames"], action, reward, success, info.get("timings"),
                        info.get("kv"))
        self._window, self._frame_start = window + 1, frame_start + len(obs["frames"])
        if self.truth is not None:
            truth_obs, *_ = self.truth.step(action)
            info = {**info, "truth_psnr_db": self.log_truth(truth_obs["frames"])}
        return obs, reward, terminated, truncated, info

    def log_truth(self, frames: np.ndarray) -> float | None:
        """Log a simulator's frames beside the last reset (one frame) or window (a chunk), for a truth loop run
        outside this wrapper (``worldstep.truth.rollout_with_truth``); returns the window's mean PSNR."""
        if self._window == 0:
            return self.log.truth(np.asarray(frames)[:1], None, 0)
        return self.log.truth(np.asarray(frames), self._window - 1, self._frame_start - len(frames))

    def close(self) -> None:
        self.recording.flush()
        super().close()


class RerunVectorLogger(VectorWrapper):
    """:class:`RerunLogger` for a gymnasium ``VectorEnv``: sub-environment ``i`` logs under ``{entity}/{i}``.

    A sub-environment's new episode logs its first frame when it starts: on the ``NEXT_STEP`` autoreset step,
    after the ending window on a ``SAME_STEP`` one (that window logged from ``final_obs``), or on a masked
    ``reset`` under ``DISABLED``. Arguments as :class:`RerunLogger`, without ``truth``.
    """

    def __init__(self, env: VectorEnv, recording: Any = None, *, embodiment: str | None = None,
                 image_format: ImageFormat = "jpeg", jpeg_quality: int = 90, entity: str = "env") -> None:
        if not isinstance(env, VectorEnv):
            raise TypeError(f"env={env!r} is invalid; allowed: a gymnasium.vector.VectorEnv")
        _, width = _check_spaces(env.single_observation_space, env.single_action_space, "env")
        recording = _check_options(recording, embodiment, image_format, jpeg_quality, entity)
        super().__init__(env)
        self.recording = recording
        first = (getattr(env.unwrapped, "envs", None) or [None])[0]
        name = embodiment if embodiment is not None else getattr(getattr(first, "unwrapped", None), "embodiment", None)
        self.logs = [RolloutLog(recording, f"{entity}/{i}", name, width, image_format, jpeg_quality)
                     for i in range(env.num_envs)]
        self._autoreset = np.zeros(env.num_envs, dtype=np.bool_)

    def reset(self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None):
        obs, infos = self.env.reset(seed=seed, options=options)
        for i, log in enumerate(self.logs):
            if _has(infos, "frame_start", i):  # a masked reset leaves the others' episodes (and logs) running
                log.reset(obs["frames"][i][0], _record_at(infos, "kv", i))
                self._autoreset[i] = False
        return obs, infos

    def step(self, actions):
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        actions = np.asarray(actions)
        for i, log in enumerate(self.logs):
            if self._autoreset[i]:
                log.reset(obs["frames"][i][0], _record_at(infos, "kv", i))
                continue
            ended_here = _has(infos, "final_obs", i)  # SAME_STEP: obs is already the next episode's
            frames, window_info = (infos["final_obs"][i]["frames"], infos["final_info"]) if ended_here else (
                obs["frames"][i], infos)
            if _has(window_info, "frame_start", i):  # a window with frames (not one that ran out of pages)
                log.window(int(window_info["window_index"][i]), int(window_info["frame_start"][i]), frames,
                           actions[i], float(rewards[i]), bool(window_info["is_success"][i]),
                           _record_at(window_info, "timings", i), _record_at(window_info, "kv", i))
            if ended_here:
                log.reset(obs["frames"][i][0], _record_at(infos, "kv", i))
        next_step = self.env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP) is AutoresetMode.NEXT_STEP
        self._autoreset = np.logical_or(terminations, truncations) & next_step
        return obs, rewards, terminations, truncations, infos

    def close(self, **kwargs: Any) -> None:
        self.recording.flush()
        super().close(**kwargs)


# --- argument checks -----------------------------------------------------------------------------


def _check_spaces(observation_space: spaces.Space, action_space: spaces.Space, name: str) -> tuple[int, int]:
    """``(chunk, action width)`` of a worldstep-style env, or TypeError naming what is allowed."""
    frames = observation_space.spaces.get("frames") if isinstance(observation_space, spaces.Dict) else None
    if not (isinstance(frames, spaces.Box) and frames.dtype == np.uint8 and len(frames.shape) == 4
            and frames.shape[-1] == 3):
        raise TypeError(f"{name}.observation_space={observation_space} is invalid; allowed: a Dict with uint8 "
                        "'frames' of shape (chunk, H, W, 3)")
    if not (isinstance(action_space, spaces.Box) and len(action_space.shape) == 2
            and action_space.shape[0] == frames.shape[0]):
        raise TypeError(f"{name}.action_space={action_space} is invalid; allowed: a Box of shape (chunk, width) "
                        f"with chunk = {frames.shape[0]}, the frames' chunk")
    return int(action_space.shape[0]), int(action_space.shape[1])


def _check_options(recording: Any, embodiment: str | None, image_format: str, jpeg_quality: int,
                   entity: str) -> Any:
    """The recording to log into; a TypeError/ValueError naming the argument otherwise."""
    rr = rerun_module()
    if recording is None:
        recording = rr.get_global_data_recording() or rr.RecordingStream("worldstep")
    if not isinstance(recording, rr.RecordingStream):
        raise TypeError(f"recording={recording!r} is invalid; allowed: None or a rerun.RecordingStream")
    if embodiment is not None and not (isinstance(embodiment, str) and embodiment):
        raise ValueError(f"embodiment={embodiment!r} is invalid; allowed: None or a non-empty name")
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"image_format={image_format!r} is invalid; allowed: {', '.join(IMAGE_FORMATS)}")
    if not is_int(jpeg_quality) or not 1 <= jpeg_quality <= 100:
        raise ValueError(f"jpeg_quality={jpeg_quality!r} is invalid; allowed: an int in 1..100")
    if not isinstance(entity, str) or not entity.strip("/"):
        raise ValueError(f"entity={entity!r} is invalid; allowed: a non-empty entity path such as 'env'")
    return recording


# --- vector infos ----------------------------------------------------------------------------------


def _has(infos: dict[str, Any], key: str, i: int) -> bool:
    mask = infos.get(f"_{key}")
    return key in infos and mask is not None and bool(mask[i])


def _record_at(infos: dict[str, Any], key: str, i: int) -> dict[str, Any] | None:
    """Sub-environment ``i``'s ``timings``/``kv`` record from a vector info (a dict of arrays), or None."""
    if not _has(infos, key, i):
        return None
    return {name: values[i] for name, values in infos[key].items() if not name.startswith("_")}
