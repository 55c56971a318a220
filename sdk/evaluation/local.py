"""The local evaluation runner: episodes in this process, one env at a time or batched through a vector env."""

from __future__ import annotations

import copy
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm
from worldstep.envs.video import Mp4Writer, frame_fps, video_writer

from ..episodes import (
    EpisodeConfig,
    EpisodeResult,
    EvalReport,
    default_windows,
    episode_configs,
    reset_options,
)
from ..outputs import write_json
from ..policies import Policy
from ..world import World, load, make_env, make_vec_env

__all__ = ["evaluate_local", "rollout"]


def rollout(env: gym.Env, policy: Policy, *, seed: int | None = 0, max_windows: int = 8,
            options: dict[str, Any] | None = None, video_path: str | os.PathLike | None = None,
            progress: bool = False, index: int = 0,
            on_window: Callable[[], Any] | None = None,
            policy_errors: Literal["raise", "record"] = "raise") -> EpisodeResult:
    """One closed-loop episode: reset, then ``policy(obs)`` -> ``env.step`` until it ends or ``max_windows``.

    With ``video_path`` every frame (the first frame, then every frame of every window) goes to an mp4
    at the env's ``frame_fps``, renamed into place when the episode ends (an exception, Ctrl-C included,
    leaves ``video_path`` as it was). With ``policy_errors="record"`` an exception raised by the policy (a
    remote policy's timeout, say) ends the episode with ``status="failed"`` instead of propagating.
    """
    if policy_errors not in ("raise", "record"):
        raise ValueError(f"policy_errors={policy_errors!r} is invalid; allowed: 'raise' or 'record'")
    start = time.perf_counter()
    result = EpisodeResult.of_env(env, seed=seed, index=index, options=options)
    try:
        policy.reset(seed)
    except Exception as err:
        if policy_errors == "raise":
            raise
        return _failed(result, err).finish(start)
    obs, _ = env.reset(seed=seed, options=options)
    with video_writer(video_path, frame_fps(env)) as writer, \
            tqdm(total=max_windows, desc="rollout", unit="window", disable=not progress) as bar:
        if writer is not None:
            writer.write(obs["frames"][0])
            result.video = str(writer.path)
        for _ in range(max_windows):
            try:
                actions = policy(obs)
            except Exception as err:
                if policy_errors == "raise":
                    raise
                _failed(result, err)
                break
            obs, reward, terminated, truncated, info = env.step(actions)
            _record(result, writer, obs["frames"], reward, terminated, truncated, info)
            bar.update(1)
            if on_window is not None:
                on_window()
            if terminated or truncated:
                break
    return result.finish(start)


def _failed(result: EpisodeResult, err: Exception) -> EpisodeResult:
    """Mark the episode failed and say so on stderr at once (the report alone is read too late)."""
    result.fail(err)
    tqdm.write(f"episode {result.index} (seed {result.seed}) failed: {result.error}", file=sys.stderr)
    return result


def evaluate_local(env_or_model: Any, policy: Policy, episodes: int | Sequence[dict | EpisodeConfig], *,
                   seed: int, success_fn: Callable[[np.ndarray], bool] | None, out_dir: Path, batched: bool,
                   batch_size: int | None, record_video: bool, progress: bool,
                   run_info: dict[str, Any] | None = None,
                   lerobot_out: str | os.PathLike | None = None) -> EvalReport:
    """`worldstep.evaluate` with ``backend="local"`` (its arguments)."""
    started = time.perf_counter()
    is_env = isinstance(env_or_model, (gym.Env, gym.vector.VectorEnv))
    if is_env and success_fn is not None:
        raise ValueError("success_fn is only used when evaluate builds the env; pass it to make_env/gym.make instead")
    batched = batched or isinstance(env_or_model, gym.vector.VectorEnv)
    if isinstance(env_or_model, gym.Env) and batched:
        raise ValueError("batched=True needs a model or a WorldModelVectorEnv, not a single env")
    world = None if is_env else (env_or_model if isinstance(env_or_model, World) else load(env_or_model))
    _check_observes_frames(env_or_model if is_env else world)
    eps = episode_configs(episodes, seed, default_windows(env_or_model if is_env else world))
    stated = [i for i, ep in enumerate(eps) if ep.start is not None and ep.start.state]
    if batched and stated:  # a batch resets with image, prompt and domain_id only
        raise ValueError(f"episodes[{stated[0]}].start.state=True is invalid with batched=True; allowed: an unbatched "
                         "run (a batched reset takes image, prompt and domain_id)")
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = getattr(env_or_model, "spec", None)
    model_name = world.config.model.name if world is not None else (spec.id if spec else type(env_or_model).__name__)
    report = EvalReport(model=model_name, policy=type(policy).__name__, batched=batched, run=dict(run_info or {}))
    videos = [out_dir / f"episode-{i:03d}.mp4" if record_video else None for i in range(len(eps))]
    env_kwargs = {"max_windows": max(ep.max_windows for ep in eps), "success_fn": success_fn}
    bar = tqdm(total=sum(ep.max_windows for ep in eps), desc="evaluate", unit="window", disable=not progress)

    def window_done() -> None:
        report.windows_completed += 1
        bar.update(1)

    try:
        if not batched:
            env = env_or_model if is_env else make_env(world, **env_kwargs)
            recorder = None if lerobot_out is None else _lerobot_recorder(env, lerobot_out)
            env = env if recorder is None else recorder
            try:
                for i, ep in enumerate(eps):
                    result = rollout(env, policy, seed=ep.seed, max_windows=ep.max_windows,
                                     options=reset_options(ep), video_path=videos[i], index=i,
                                     on_window=window_done, policy_errors="record")
                    report.episodes.append(result)
                    bar.update(ep.max_windows - result.windows)  # windows an early end skipped
                if recorder is not None:
                    recorder.finish()
            finally:
                if recorder is not None:
                    recorder.writer.abort()  # no-op once finish wrote the dataset
                    env = recorder.env
                if not is_env:
                    env.close()
        else:
            size = batch_size or (env_or_model.num_envs if is_env else len(eps))
            lerobot = None  # (writer, camera keys), opened on the first batch's env
            try:
                for start in range(0, len(eps), size):
                    group = list(range(start, min(start + size, len(eps))))
                    vec = env_or_model if is_env else make_vec_env(world, num_envs=len(group), **env_kwargs)
                    try:
                        if lerobot_out is not None and lerobot is None:
                            lerobot = _lerobot_writer(vec, lerobot_out)
                        report.episodes += _run_batch(vec, policy, [eps[i] for i in group], group,
                                                      [videos[i] for i in group], window_done, bar, lerobot)
                    finally:
                        if not is_env:
                            vec.close()
                if lerobot is not None:
                    lerobot[0].close()
            finally:
                if lerobot is not None:
                    lerobot[0].abort()  # no-op once close wrote the dataset
    except KeyboardInterrupt:
        report.status = "interrupted"
        raise
    finally:
        bar.close()
        report.wall_s = time.perf_counter() - started
        write_json(out_dir / "report.json", report.to_dict())
    return report


def _check_observes_frames(env_or_world: Any) -> None:
    """An evaluation reads frames (its videos, frame counts and pixel judges): a latent env is refused before any
    episode, naming the fix."""
    if isinstance(env_or_world, World):
        observation = env_or_world.config.env.observation
    else:
        space = getattr(env_or_world, "single_observation_space", env_or_world.observation_space)
        observation = "latents" if isinstance(space, gym.spaces.Dict) and "latents" in space.spaces else "frames"
    if observation != "frames":
        raise ValueError(f"observation={observation!r} is invalid for evaluate, which reads each window's frames; "
                         "allowed: an env or world with observation='frames' (a latent env's frames come from "
                         "render())")


def _lerobot_recorder(env: gym.Env, root: str | os.PathLike):
    from ..lerobot.imagined import RecordLeRobot

    return RecordLeRobot(env, root)


def _lerobot_writer(vec, root: str | os.PathLike):
    from ..lerobot.imagined import open_writer

    return open_writer(vec, root)


def _record(result: EpisodeResult, writer: Mp4Writer | None, frames: np.ndarray, reward, terminated, truncated,
            info: dict[str, Any]) -> None:
    if not info.get("kv_exhausted", False):
        result.windows += 1
        result.frames += len(frames)
        if writer is not None:
            writer.write(frames)
    result.episode_return += float(reward)
    result.success = result.success or bool(info.get("is_success", False))
    result.terminated, result.truncated = bool(terminated), bool(truncated)


@dataclass
class _Slot:
    """One vector-env slot of a batch: its episode, its own copy of the policy, its result and its video."""

    episode: EpisodeConfig
    policy: Policy
    result: EpisodeResult
    writer: Mp4Writer | None
    active: bool

    def end(self, bar, start: float, err: Exception | None = None) -> None:
        """The episode is over (``err``: its policy raised, the report keeps it marked failed)."""
        self.active = False
        bar.update(self.episode.max_windows - self.result.windows)
        if err is not None:
            _failed(self.result, err)
        self.result.finish(start)
        if self.writer is not None and self.writer.frames_written:
            self.writer.close()
        elif self.writer is not None:  # failed before its first frame: no empty video
            self.writer.abort()
            self.result.video = None


def _run_batch(vec, policy: Policy, eps: list[EpisodeConfig], indices: list[int], videos: list,
               window_done: Callable[[], None], bar, lerobot: tuple | None = None) -> list:
    """Episodes in the first ``len(eps)`` slots of ``vec``; extra slots repeat the last episode, unrecorded and
    never asked for actions. ``lerobot``: (writer, camera keys) the batch's episodes are added to, in order."""
    n = vec.num_envs
    episodes = eps + [eps[-1]] * (n - len(eps))
    options = [reset_options(ep) for ep in episodes]
    merged = {key: [o.get(key) for o in options] for key in ("image", "prompt", "domain_id")}
    start = time.perf_counter()
    obs, _ = vec.reset(seed=[ep.seed for ep in episodes], options=merged)
    # a WorldModelVectorEnv's sub-environments hold the defaults
    subs = [getattr(sub, "unwrapped", None) for sub in getattr(vec, "envs", [None] * n)]
    slots = [_Slot(ep, copy.deepcopy(policy),
                   EpisodeResult(index=i, seed=ep.seed, prompt=ep.prompt or getattr(sub, "prompt", None),
                                 domain_id=getattr(sub, "domain_id", None) if ep.domain_id is None else ep.domain_id),
                   None if video is None else Mp4Writer(video, frame_fps(vec)), True)
             for ep, i, video, sub in zip(eps, indices, videos, subs)]
    zeros = np.zeros(vec.single_action_space.shape, np.float32)
    buffers = None if lerobot is None else _episode_buffers(lerobot, obs, slots, vec)

    def act(i: int) -> np.ndarray:
        slot = slots[i] if i < len(slots) else None
        if slot is not None and slot.active:
            try:
                return slot.policy({k: v[i] for k, v in obs.items()})
            except Exception as err:  # a policy raised: keep the episode, marked failed
                slot.end(bar, start, err)
        return zeros

    try:
        for i, slot in enumerate(slots):
            try:
                slot.policy.reset(slot.episode.seed)
            except Exception as err:
                slot.end(bar, start, err)
                continue
            if slot.writer is not None:
                slot.writer.write(obs["frames"][i][0])
                slot.result.video = str(slot.writer.path)
        while any(s.active for s in slots):
            actions = np.stack([act(i) for i in range(n)])
            if not any(s.active for s in slots):
                break
            obs, rewards, terms, truncs, infos = vec.step(actions)
            for i, slot in enumerate(slots):
                if not slot.active:
                    continue
                info = {k: bool(infos[k][i]) for k in ("is_success", "kv_exhausted")
                        if k in infos and infos[f"_{k}"][i]}
                _record(slot.result, slot.writer, obs["frames"][i], rewards[i], terms[i], truncs[i], info)
                if buffers is not None:
                    buffers[i].step({k: v[i] for k, v in obs.items()}, actions[i], info)
                window_done()
                if terms[i] or truncs[i] or slot.result.windows >= slot.episode.max_windows:
                    slot.end(bar, start)
    except BaseException:
        for slot in slots:
            if slot.writer is not None:
                slot.writer.abort()  # the episodes of this batch did not finish: no video replaces an earlier one
        raise
    for buffer in buffers or []:
        buffer.add_to(lerobot[0])
    return [slot.result for slot in slots]


def _episode_buffers(lerobot: tuple, obs: dict[str, np.ndarray], slots: list, vec) -> list:
    from ..lerobot.imagined import EpisodeBuffer

    writer, keys = lerobot
    subs = getattr(vec, "envs", [None] * len(slots))
    return [EpisodeBuffer(keys, writer.action_width, {k: v[i] for k, v in obs.items()},
                          slot.result.prompt or getattr(getattr(sub, "unwrapped", None), "prompt", None)
                          or "imagined episode")
            for i, (slot, sub) in enumerate(zip(slots, subs))]
