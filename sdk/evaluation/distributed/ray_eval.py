"""``evaluate(..., backend="ray")``: the same episodes and report as the local path, run on Ray actors."""

from __future__ import annotations

import math
import os
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm
from worldstep.engine.checks import check_int

from ...config import WorldstepConfig
from ...episodes import EpisodeConfig, EpisodeResult, EvalReport, episode_configs
from ...outputs import write_json
from ...policies import Policy
from .shard_queue import ShardQueue
from .worker import EpisodeOutput, EvalWorker, Shard

CPUS_PER_WORKER = 0.5
"""CPU share of one actor on a CPU-only cluster: fractional, so N actors fit on a small machine."""


class RayUnavailableError(ImportError):
    """``backend="ray"`` was asked for, but Ray is not installed."""


def require_ray():
    """The ``ray`` module, or :class:`RayUnavailableError` naming the extra that installs it."""
    try:
        import ray
    except ImportError as err:
        raise RayUnavailableError("backend='ray' needs Ray, an optional extra: pip install 'worldstep[dist]'") from err
    return ray


def evaluate_ray(model: Any, policy: Policy, episodes: int | Sequence[dict | EpisodeConfig] = 1, *,
                 success_fn: Callable[[np.ndarray], bool] | None = None, out_dir: str | os.PathLike = "runs/eval",
                 batched: bool = False, batch_size: int | None = None, seed: int = 0, record_video: bool = True,
                 progress: bool = True, ray_address: str | None = None, num_workers: int = 2,
                 max_retries: int = 2, cpus_per_worker: float | None = None,
                 timeout_s: float | None = None, run_info: dict[str, Any] | None = None) -> EvalReport:
    """:func:`worldstep.evaluate` over ``num_workers`` Ray actors; writes the same ``report.json`` and mp4s.

    Args:
        model: anything :func:`worldstep.load` takes (not an env: every actor loads its own model from
            the config; a ``World`` contributes its config). The checkpoint path must exist on every node;
            the embedded ``tiny`` model builds itself per node into ``$WORLDSTEP_CACHE``.
        policy, episodes, success_fn, out_dir, seed, record_video, progress: as in ``evaluate``. The
            policy and ``success_fn`` are pickled to every actor; ``policy.reset(seed)`` must fully reset
            it (as for batched runs). Image paths in ``episodes`` are read on the actors' nodes.
        batched: each actor steps its shard through one vector env.
        batch_size: episodes per shard when batched (default: an even split over the workers); unbatched
            shards hold one episode, so results stream back per episode.
        ray_address: cluster to join (None: ``$RAY_ADDRESS`` or a new local cluster). A Ray already
            initialised in this process is used as it is; a cluster started here is shut down at the end.
        num_workers: actors, each one model: one GPU each when the cluster has GPUs (capped at the GPU
            count), else ``cpus_per_worker`` CPUs.
        max_retries: re-runs of a shard whose actor died, on a fresh actor, before its episodes are
            reported ``status: "failed"``.
        cpus_per_worker: CPU share per actor on CPU-only clusters (default: 0.5, less when that would not
            fit every actor on the cluster).
        timeout_s: raise ``TimeoutError`` when the whole evaluation takes longer (None: no limit).
        run_info: recorded as ``run`` in ``report.json``.
    """
    ray = require_ray()
    if isinstance(model, (gym.Env, gym.vector.VectorEnv)):
        raise ValueError("backend='ray' needs a model (a name, config, checkpoint or World), not an env: every "
                         "Ray actor loads its own copy of the model")
    check_int("num_workers", num_workers, 1)
    check_int("max_retries", max_retries, 0)
    if batch_size is not None:
        check_int("batch_size", batch_size, 1)
    config = _config_of(model)
    eps = episode_configs(episodes, seed, config.env.max_windows)
    started = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    started_ray = not ray.is_initialized()
    if started_ray:
        _init_ray(ray, ray_address)
    elif ray_address is not None:
        warnings.warn(f"Ray is already initialised in this process; ray_address={ray_address!r} is ignored",
                      stacklevel=2)
    try:
        options, workers = _actor_options(ray.cluster_resources(), num_workers, cpus_per_worker)
        shards = _shards(eps, batched, batch_size, workers)
        remote_cls = ray.remote(EvalWorker)
        run_id = uuid.uuid4().hex[:8]

        def make_actor(k: int):
            return remote_cls.options(name=f"worldstep-eval-{run_id}-{k}", **options).remote(
                config, policy, success_fn, batched, record_video, max(ep.max_windows for ep in eps),
                torch_threads(options["num_cpus"]))

        report = EvalReport(model=config.model.name, policy=type(policy).__name__, batched=batched,
                            run=dict(run_info or {}))
        bar = tqdm(total=len(eps), desc=f"evaluate (ray, {workers} workers)", unit="episode", disable=not progress)
        shard_queue = ShardQueue(make_actor, workers, max_retries)

        def done(output: EpisodeOutput) -> None:
            report.episodes.append(_save(output, out_dir))
            bar.update(1)
            bar.set_postfix(failed=sum(e.status == "failed" for e in report.episodes), deaths=shard_queue.deaths)

        def failed(shard: Shard, error: str) -> None:
            for index, ep in zip(shard.indices, shard.episodes):
                done(EpisodeOutput(EpisodeResult(index=index, seed=ep.seed).fail(error), None))

        try:
            shard_queue.run(shards, done, failed, timeout_s=timeout_s)  # kills its actors however it ends
        except KeyboardInterrupt:
            report.status = "interrupted"  # the report of the episodes that finished, as the local backend's
            _write_report(report, out_dir, started)
            raise
        finally:
            bar.close()
    finally:
        if started_ray:
            ray.shutdown()
    _write_report(report, out_dir, started)
    return report


def _write_report(report: EvalReport, out_dir: Path, started: float) -> None:
    report.episodes.sort(key=lambda e: e.index)
    report.wall_s = time.perf_counter() - started
    write_json(out_dir / "report.json", report.to_dict())



def driver_target(model: Any, **overrides: Any) -> tuple[Any, tuple[int, int]]:
    """What a Ray driver hands ``evaluate``: the config (loading the model only when the action shape
    cannot be read without it) and ``(chunk_size, action_width)`` for building the policy."""
    from ...world import load, resolve_config

    require_ray()
    config = resolve_config(model).with_overrides(**overrides)
    shape = action_shape(config)
    if shape is not None:
        return config, shape
    world = load(config)
    return world, world.action_shape


def action_shape(config: WorldstepConfig) -> tuple[int, int] | None:
    """``(chunk_size, action_width)`` read from the config (and a local checkpoint's transformer config),
    without loading the model: a Ray driver need not hold a copy. None when only loading would tell."""
    width = config.env.action_width
    if width is None and (config.env.embodiment is not None or config.env.domain_id is not None):
        width = _embodiment_width(config)
    return None if width is None else (config.rollout.chunk_size, int(width))


def _embodiment_width(config: WorldstepConfig) -> int | None:
    """The raw width of ``env.embodiment`` (or of ``env.domain_id``'s embodiment) from the built-in registry or
    a local checkpoint folder's own; None when that cannot tell (loading then refuses it, naming the allowed
    names)."""
    from worldstep.engine.embodiment.conditioning import embodiment_width
    from worldstep.engine.embodiment.embodiments import EmbodimentRegistry, folder_registry

    folder = Path(config.model.checkpoint)
    registry = folder_registry(folder) if folder.is_dir() else EmbodimentRegistry.default()
    try:
        return embodiment_width(registry, config.env.embodiment, config.env.domain_id)
    except ValueError:
        return None


def _config_of(model: Any) -> WorldstepConfig:
    from ...world import resolve_config

    return resolve_config(model)


def _init_ray(ray, address: str | None) -> None:
    """Join ``address`` (or ``$RAY_ADDRESS``), else start a small local cluster without the dashboard."""
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(include_dashboard=False, log_to_driver=False)


def _actor_options(resources: dict[str, float], num_workers: int,
                   cpus_per_worker: float | None) -> tuple[dict[str, Any], int]:
    """Ray resources of one actor and how many actors to start.

    One GPU per actor when the cluster has GPUs (more actors than GPUs would wait forever, so their
    number is capped); otherwise a fractional CPU share small enough for every actor to fit.
    """
    gpus, cpus = int(resources.get("GPU", 0)), float(resources.get("CPU", 0))
    if gpus >= 1:
        if num_workers > gpus:
            warnings.warn(f"num_workers={num_workers} but the cluster has {gpus} GPUs: starting {gpus} workers",
                          stacklevel=3)
        workers = min(num_workers, gpus)
        return {"num_gpus": 1, "num_cpus": min(1.0, cpus / workers) if cpus else 0}, workers
    if cpus_per_worker is None:
        cpus_per_worker = min(CPUS_PER_WORKER, math.floor(100 * cpus / num_workers) / 100) if cpus else 0
    elif isinstance(cpus_per_worker, bool) or not isinstance(cpus_per_worker, (int, float)) or cpus_per_worker < 0:
        raise ValueError(f"cpus_per_worker={cpus_per_worker!r} is invalid; allowed: a number >= 0")
    return {"num_cpus": float(cpus_per_worker)}, num_workers


def torch_threads(num_cpus: float) -> int:
    """torch threads of an actor holding ``num_cpus`` CPUs: its whole share, at least one.

    Set explicitly rather than left to Ray's environment: a kernel may split its work, and round, by the
    thread count, so a local run at the same count gives the same frames (docs/exactness.md).
    """
    return max(1, math.floor(num_cpus))


def _shards(eps: list[EpisodeConfig], batched: bool, batch_size: int | None, workers: int) -> list[Shard]:
    size = (batch_size or math.ceil(len(eps) / workers)) if batched else 1
    return [Shard(list(range(i, min(i + size, len(eps)))), eps[i:i + size]) for i in range(0, len(eps), size)]


def _save(output: EpisodeOutput, out_dir: Path) -> EpisodeResult:
    """The episode's result with its mp4 written where the local path writes it."""
    result = output.result
    if output.video is not None:
        path = out_dir / f"episode-{result.index:03d}.mp4"
        path.write_bytes(output.video)
        result.video = str(path)
    return result
