"""Run a policy for episodes in a world model: ``rollout`` (one episode) and ``evaluate`` (a report)."""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm
from worldstep.envs.video import Mp4Writer, frame_fps

from .config import ConfigError, NonNegativeInt, PositiveInt, _Config
from .outputs import write_json
from .policies import Policy

__all__ = ["EpisodeConfig", "EpisodeResult", "EvalReport", "evaluate", "rollout"]


class EpisodeConfig(_Config):
    """One evaluation episode; None fields take the env's defaults."""

    seed: NonNegativeInt | None = None
    """reset seed (None: ``evaluate``'s ``seed`` + the episode's index)"""
    prompt: str | None = None
    """text prompt"""
    domain_id: NonNegativeInt | None = None
    """embodiment domain"""
    image: str | None = None
    """path of the first frame (PNG/JPEG/.npy)"""
    max_windows: PositiveInt | None = None
    """windows before the episode is cut off (None: the env's ``max_windows``, i.e. the config's
    ``env.max_windows``)"""


@dataclass
class EpisodeResult:
    """What one episode did; ``video`` is the mp4 path (None when not recorded)."""

    index: int
    seed: int
    prompt: str | None = None
    """the episode's prompt (its own, or the env's default)"""
    domain_id: int | None = None
    windows: int = 0
    frames: int = 0
    episode_return: float = 0.0
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    wall_s: float = 0.0
    frames_per_second: float = 0.0
    video: str | None = None
    status: Literal["ok", "failed", "interrupted"] = "ok"
    error: str | None = None
    """why a failed episode stopped (its policy raised, or its Ray worker died past the retries)"""

    def fail(self, err: BaseException | str) -> EpisodeResult:
        """Mark the episode failed: the report keeps it (with what it did so far) instead of dropping it."""
        self.status = "failed"
        self.error = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
        return self

    def finish(self, start: float) -> EpisodeResult:
        self.wall_s = time.perf_counter() - start
        self.frames_per_second = self.frames / self.wall_s if self.wall_s > 0 else 0.0
        return self


@dataclass
class EvalReport:
    """Aggregate and per-episode results; ``to_dict()`` is what ``report.json`` holds."""

    model: str
    policy: str
    batched: bool
    episodes: list[EpisodeResult] = field(default_factory=list)
    wall_s: float = 0.0
    """wall-clock seconds of the whole run (batched episodes overlap, so this is not their sum)"""
    status: Literal["ok", "interrupted"] = "ok"
    """``interrupted``: Ctrl-C stopped the run; ``episodes`` holds the ones that finished"""
    windows_completed: int = 0
    """windows generated in all, an interrupted episode's included"""
    run: dict[str, Any] = field(default_factory=dict)
    """what the caller records about the run (the CLI: command, policy, seed, prompt, ``--set`` overrides)"""

    @property
    def success_rate(self) -> float:
        return float(np.mean([e.success for e in self.episodes])) if self.episodes else 0.0

    @property
    def mean_return(self) -> float:
        return float(np.mean([e.episode_return for e in self.episodes])) if self.episodes else 0.0

    def to_dict(self) -> dict[str, Any]:
        frames = sum(e.frames for e in self.episodes)
        return {
            "status": self.status,
            "model": self.model,
            "policy": self.policy,
            "batched": self.batched,
            "windows_completed": max(self.windows_completed, sum(e.windows for e in self.episodes)),
            "num_episodes": len(self.episodes),
            "num_failed": sum(e.status == "failed" for e in self.episodes),
            "success_rate": self.success_rate,
            "mean_return": self.mean_return,
            "mean_windows": float(np.mean([e.windows for e in self.episodes])) if self.episodes else 0.0,
            "total_frames": frames,
            "total_wall_s": self.wall_s,
            "frames_per_second": frames / self.wall_s if self.wall_s > 0 else 0.0,
            "run": self.run,
            "episodes": [asdict(e) for e in self.episodes],
        }


def _reset_options(episode: EpisodeConfig) -> dict[str, Any]:
    from .world import read_image

    options: dict[str, Any] = {"prompt": episode.prompt, "domain_id": episode.domain_id}
    if episode.image is not None:
        options["image"] = read_image(episode.image)
    return {k: v for k, v in options.items() if v is not None}


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
    inner = getattr(env, "unwrapped", env)
    given = options or {}
    result = EpisodeResult(index=index, seed=-1 if seed is None else seed,
                           prompt=given.get("prompt") or getattr(inner, "prompt", None),
                           domain_id=given.get("domain_id", getattr(inner, "domain_id", None)))
    try:
        policy.reset(seed)
    except Exception as err:
        if policy_errors == "raise":
            raise
        return result.fail(err).finish(start)
    obs, _ = env.reset(seed=seed, options=options)
    writer = None if video_path is None else Mp4Writer(video_path, frame_fps(env))
    bar = tqdm(total=max_windows, desc="rollout", unit="window", disable=not progress)
    try:
        if writer is not None:
            writer.write(obs["frames"][0])
            result.video = str(writer.path)
        for _ in range(max_windows):
            try:
                actions = policy(obs)
            except Exception as err:
                if policy_errors == "raise":
                    raise
                result.fail(err)
                break
            obs, reward, terminated, truncated, info = env.step(actions)
            _record(result, writer, obs["frames"], reward, terminated, truncated, info)
            bar.update(1)
            if on_window is not None:
                on_window()
            if terminated or truncated:
                break
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        bar.close()
    if writer is not None:
        writer.close()
    return result.finish(start)


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


def _episodes(episodes: int | Sequence[dict | EpisodeConfig], seed: int,
              max_windows: int | None = None) -> list[EpisodeConfig]:
    """Episodes as configs; a missing seed is ``seed + index``, a missing ``max_windows`` the env's."""
    if isinstance(episodes, int) and not isinstance(episodes, bool):
        if episodes < 1:
            raise ValueError(f"episodes={episodes} is invalid; allowed: an int >= 1 or a list of episodes")
        episodes = [{} for _ in range(episodes)]
    if not isinstance(episodes, Sequence) or isinstance(episodes, str) or not episodes:
        raise ValueError(f"episodes={episodes!r} is invalid; allowed: an int >= 1 or a non-empty list of episodes")
    out = []
    for i, ep in enumerate(episodes):
        if isinstance(ep, dict):
            try:
                ep = EpisodeConfig(**ep)
            except ConfigError as err:
                raise ConfigError("\n".join(f"episodes[{i}].{line}" for line in str(err).splitlines())) from None
        elif not isinstance(ep, EpisodeConfig):
            raise ValueError(f"episodes[{i}]={ep!r} is invalid; allowed: a dict or an EpisodeConfig")
        if ep.seed is None:
            ep = ep.replace(seed=seed + i)
        if ep.max_windows is None:
            if max_windows is None:
                raise ValueError(f"episodes[{i}].max_windows is missing and the env has no max_windows; "
                                 "allowed: an int >= 1")
            ep = ep.replace(max_windows=max_windows)
        out.append(ep)
    return out


def default_windows(env_or_world: Any) -> int | None:
    """The episode length an env or World runs by default: its ``max_windows`` (the config's
    ``env.max_windows``), else its registration's ``max_episode_steps``."""
    config = getattr(env_or_world, "config", None)
    if config is not None and hasattr(config, "env"):
        return config.env.max_windows
    inner = env_or_world.envs[0] if hasattr(env_or_world, "envs") else getattr(env_or_world, "unwrapped", None)
    windows = getattr(inner, "max_windows", None)
    if windows is None and getattr(env_or_world, "spec", None) is not None:
        windows = env_or_world.spec.max_episode_steps
    return windows


def evaluate(env_or_model: Any, policy: Policy, episodes: int | Sequence[dict | EpisodeConfig] = 1, *,
             success_fn: Callable[[np.ndarray], bool] | None = None,
             out_dir: str | os.PathLike = "runs/eval", batched: bool = False, batch_size: int | None = None,
             seed: int = 0, record_video: bool = True, progress: bool = True,
             backend: Literal["local", "ray"] = "local", ray_address: str | None = None,
             num_workers: int | None = None, run_info: dict[str, Any] | None = None) -> EvalReport:
    """Run ``policy`` for ``episodes`` and write ``out_dir/report.json`` plus one mp4 per episode.

    An episode whose policy raises is kept in the report with ``status: "failed"`` and its ``error``;
    the other episodes still run.

    Args:
        env_or_model: a worldstep env (``gym.make(...)``, ``make_env(...)``), a ``WorldModelVectorEnv``
            (implies ``batched``), or anything :func:`worldstep.load` takes (``"tiny"``, a ``World``, ...).
        policy: a :class:`~worldstep.policies.Policy`; batched runs use one deep copy per episode slot.
        episodes: a count, or a list of dicts / :class:`EpisodeConfig` (seed, prompt, domain_id, image,
            max_windows; a missing ``max_windows`` is the env's, i.e. the config's ``env.max_windows``).
        success_fn: ``frames -> bool`` per window; ends the episode as a success. Give it here when
            ``env_or_model`` is a model; an env you built carries its own.
        out_dir: where ``report.json`` and ``episode-XXX.mp4`` go (each written under a temporary name and
            renamed when complete; Ctrl-C writes ``report.json`` with ``"status": "interrupted"`` and the
            episodes that finished, then re-raises ``KeyboardInterrupt``).
        batched: step episodes together through one vector env (one batched forward per step).
        batch_size: episodes per batch (default: all of them).
        seed: seed of episode ``i`` when it has none is ``seed + i``.
        record_video: write the mp4 files.
        progress: show a progress bar over windows.
        backend: ``"local"`` runs here; ``"ray"`` shards episodes over Ray actors, each loading its own
            copy of the model (needs ``pip install 'worldstep[dist]'``; see ``docs/distributed.md``).
        ray_address: the Ray cluster to join (None: ``$RAY_ADDRESS``, else a new local one); ray only.
        num_workers: Ray actors, one model each (default 2); ray only.
        run_info: recorded as ``run`` in ``report.json`` (JSON-serialisable).
    """
    if backend not in ("local", "ray"):
        raise ValueError(f"backend={backend!r} is invalid; allowed: 'local' or 'ray'")
    if backend == "ray":
        from .distributed import evaluate_ray

        return evaluate_ray(env_or_model, policy, episodes, success_fn=success_fn, out_dir=out_dir,
                            batched=batched, batch_size=batch_size, seed=seed, record_video=record_video,
                            progress=progress, ray_address=ray_address,
                            num_workers=2 if num_workers is None else num_workers, run_info=run_info)
    if ray_address is not None or num_workers is not None:
        raise ValueError("ray_address and num_workers only apply with backend='ray'")
    from .world import World, load, make_env, make_vec_env

    started = time.perf_counter()
    is_env = isinstance(env_or_model, (gym.Env, gym.vector.VectorEnv))
    if is_env and success_fn is not None:
        raise ValueError("success_fn is only used when evaluate builds the env; pass it to make_env/gym.make instead")
    batched = batched or isinstance(env_or_model, gym.vector.VectorEnv)
    if isinstance(env_or_model, gym.Env) and batched:
        raise ValueError("batched=True needs a model or a WorldModelVectorEnv, not a single env")
    world = None if is_env else (env_or_model if isinstance(env_or_model, World) else load(env_or_model))
    eps = _episodes(episodes, seed, default_windows(env_or_model if is_env else world))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = getattr(env_or_model, "spec", None)
    model_name = world.config.model.name if world is not None else (spec.id if spec else type(env_or_model).__name__)
    report = EvalReport(model=model_name, policy=type(policy).__name__, batched=batched, run=dict(run_info or {}))
    videos = [out_dir / f"episode-{i:03d}.mp4" if record_video else None for i in range(len(eps))]
    longest = max(ep.max_windows for ep in eps)
    env_kwargs = {"max_windows": longest, "success_fn": success_fn}
    bar = tqdm(total=sum(ep.max_windows for ep in eps), desc="evaluate", unit="window", disable=not progress)

    def window_done() -> None:
        report.windows_completed += 1
        bar.update(1)

    try:
        if not batched:
            env = env_or_model if is_env else make_env(world, **env_kwargs)
            try:
                for i, ep in enumerate(eps):
                    result = rollout(env, policy, seed=ep.seed, max_windows=ep.max_windows,
                                     options=_reset_options(ep), video_path=videos[i], index=i,
                                     on_window=window_done, policy_errors="record")
                    report.episodes.append(result)
                    bar.update(ep.max_windows - result.windows)  # windows an early end skipped
            finally:
                if not is_env:
                    env.close()
        else:
            size = batch_size or (env_or_model.num_envs if is_env else len(eps))
            for start in range(0, len(eps), size):
                group = list(range(start, min(start + size, len(eps))))
                vec = env_or_model if is_env else make_vec_env(world, num_envs=len(group), **env_kwargs)
                try:
                    report.episodes += _run_batch(vec, policy, [eps[i] for i in group], group,
                                                  [videos[i] for i in group], bar, report)
                finally:
                    if not is_env:
                        vec.close()
    except KeyboardInterrupt:
        report.status = "interrupted"
        raise
    finally:
        bar.close()
        report.wall_s = time.perf_counter() - started
        write_json(out_dir / "report.json", report.to_dict())
    return report


def _run_batch(vec, policy: Policy, eps: list[EpisodeConfig], indices: list[int], videos: list, bar,
               report: EvalReport) -> list:
    """Episodes in the first ``len(eps)`` slots of ``vec``; extra slots repeat the last episode unrecorded."""
    n = vec.num_envs
    slots = eps + [eps[-1]] * (n - len(eps))
    options = [_reset_options(ep) for ep in slots]
    merged = {key: [o.get(key) for o in options] for key in ("image", "prompt", "domain_id")}
    start = time.perf_counter()
    obs, _ = vec.reset(seed=[ep.seed for ep in slots], options=merged)
    policies = [copy.deepcopy(policy) for _ in slots]
    subs = getattr(vec, "envs", [None] * n)  # a WorldModelVectorEnv's sub-environments hold the defaults
    results = [EpisodeResult(index=i, seed=ep.seed, prompt=ep.prompt or getattr(sub, "prompt", None),
                             domain_id=getattr(sub, "domain_id", None) if ep.domain_id is None else ep.domain_id)
               for i, ep, sub in zip(indices, eps, subs)]
    writers = [None if v is None else Mp4Writer(v, frame_fps(vec)) for v in videos]
    active = [i < len(eps) for i in range(n)]

    def fail(i: int, err: Exception) -> None:  # a policy raised: keep the episode, marked failed
        active[i] = False
        bar.update(eps[i].max_windows - results[i].windows)
        results[i].fail(err).finish(start)
        if writers[i] is not None:
            writers[i].close()

    def act(i: int) -> np.ndarray:
        if active[i]:
            try:
                return policies[i]({k: v[i] for k, v in obs.items()})
            except Exception as err:
                fail(i, err)
        return zeros

    try:
        for i, ep in enumerate(eps):  # padding slots stay inactive: their policies are never called
            try:
                policies[i].reset(ep.seed)
            except Exception as err:
                fail(i, err)
                continue
            if writers[i] is not None:
                writers[i].write(obs["frames"][i][0])
                results[i].video = str(writers[i].path)
        zeros = np.zeros(vec.single_action_space.shape, np.float32)
        while any(active):
            actions = np.stack([act(i) for i in range(n)])
            if not any(active):
                break
            obs, rewards, terms, truncs, infos = vec.step(actions)
            for i in np.flatnonzero(active):
                info = {k: bool(infos[k][i]) for k in ("is_success", "kv_exhausted") if k in infos and infos[f"_{k}"][i]}
                _record(results[i], writers[i], obs["frames"][i], rewards[i], terms[i], truncs[i], info)
                report.windows_completed += 1
                bar.update(1)
                if terms[i] or truncs[i] or results[i].windows >= eps[i].max_windows:
                    active[i] = False
                    bar.update(eps[i].max_windows - results[i].windows)
                    results[i].finish(start)
                    if writers[i] is not None:
                        writers[i].close()
    except BaseException:
        for w in writers:
            if w is not None:
                w.abort()  # the episodes of this batch did not finish: no video replaces an earlier one
        raise
    for w in writers:
        if w is not None:
            w.close()
    return results
