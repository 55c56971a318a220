"""Units of model work for the fidelity report, run inline or in worker processes.

Each task is a small frozen dataclass whose `run(worker)` does one piece of model work and returns
plain numpy/dataclass results. A `Worker` holds what a process loaded once: the engine model (for
batched sessions) and, on first use, a world-model env (for the planner, which forks envs).
Processes share nothing; cost is per session-window and batching does not amortise it on a CPU, so
separate processes are what scales.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from worldstep.envs.push_policies import graded_policies

from ..planning import ModelPredictivePlanner, closed_loop
from ..recipes.open_loop import RolloutRecipe, open_loop
from ..recipes.vae_round_trip import vae_round_trip
from ..trust.rule import SelectiveRule
from ..trust.signals import trained_horizon_for
from .journal import Journal, StretchSpent
from .rollouts import model_episodes


@dataclass
class Worker:
    """A process's loaded model (and planner env), built on first use."""

    path: str
    threads: int
    recipe: RolloutRecipe
    max_windows: int = 16
    _world: Any = field(default=None, repr=False)
    _env: Any = field(default=None, repr=False)

    @property
    def world(self):
        if self._world is None:
            from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel
            from worldstep.world import resolve_config

            torch.set_num_threads(self.threads)
            decoder = resolve_config(self.path).decoder  # as the folder's config decodes
            self._world = Cosmos3WorldModel.from_pretrained(self.path, device="cpu", page_size=4, num_pages=32768,
                                                            decoder=decoder)
        return self._world

    @property
    def env(self):
        if self._env is None:
            import worldstep

            torch.set_num_threads(self.threads)
            knobs = self.recipe.knobs
            # the env judges nothing: closed_loop alone judges the model's success streak (confirm_windows)
            self._env = worldstep.make_env(self.path, num_steps=knobs.num_steps, context_frames=knobs.context_frames,
                                           flow_shift=knobs.flow_shift, max_windows=self.max_windows,
                                           success_fn="none")
        return self._env

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
        if self._world is not None:
            self._world.close_all()


@dataclass(frozen=True)
class OpenLoopTask:
    """Model frames and decoded first frames for clips (`seeds` seed the diffusion noise)."""

    first: np.ndarray
    actions: np.ndarray
    seeds: tuple[int, ...]

    def run(self, worker: Worker) -> tuple[np.ndarray, np.ndarray]:
        return open_loop(worker.world, self.first, self.actions, worker.recipe, "kv", list(self.seeds))


@dataclass(frozen=True)
class ReconstructTask:
    """VAE round trip of whole clips `[N, 1 + T, H, W, 3]` -> frames 1..T: the ceiling of any rollout."""

    frames: np.ndarray

    def run(self, worker: Worker) -> np.ndarray:
        return np.stack([vae_round_trip(worker.world.vae, clip) for clip in self.frames])


@dataclass(frozen=True)
class EpisodesTask:
    """Model episodes of the graded policies `policy_ids` from `seeds` (with simulator replay), and the trust
    study's continuation windows and agreement forks (`model_episodes`)."""

    policy_ids: tuple[int, ...]
    seeds: tuple[int, ...]
    max_windows: int
    continue_windows: int = 0
    agreement_forks: int = 0

    def run(self, worker: Worker) -> list:
        policies = [graded_policies(worker.recipe.chunk_size)[i] for i in self.policy_ids]
        return model_episodes(worker.world, policies, list(self.seeds), self.max_windows, worker.recipe,
                              policy_ids=list(self.policy_ids), continue_windows=self.continue_windows,
                              agreement_forks=self.agreement_forks)


@dataclass(frozen=True)
class PlannerTask:
    """Closed-loop planner episodes (`worldstep.planning`) proposing from graded policy `base`; a model loop with
    `stop_rule` stops on the selective judge's claim (the checkpoint's trained horizon), not the streak alone."""

    base: str
    candidates: int
    seeds: tuple[int, ...]
    max_windows: int
    observe: str
    anchor_every: int | None = None
    horizon: int = 2
    forks: int = 2
    confirm_windows: int = 1
    stop_rule: SelectiveRule | None = None

    def run(self, worker: Worker) -> list:
        policies = {p.name: p for p in graded_policies(worker.recipe.chunk_size)}
        planner = ModelPredictivePlanner(worker.env, copy.deepcopy(policies[self.base]), self.candidates,
                                         horizon=self.horizon, forks=self.forks)
        horizon = None if self.stop_rule is None else trained_horizon_for(worker.path)
        return [closed_loop(worker.env, planner, seed=seed, max_windows=self.max_windows, observe=self.observe,
                            anchor_every=self.anchor_every, confirm_windows=self.confirm_windows,
                            stop_rule=self.stop_rule, trained_horizon=horizon)
                for seed in self.seeds]


_WORKER: list[Worker] = []  # this process's Worker when running in a pool (set by the initializer)


def _init_worker(path: str, threads: int, recipe: RolloutRecipe, max_windows: int) -> None:
    _WORKER.append(Worker(path, threads, recipe, max_windows))


def _run_in_worker(task) -> Any:
    return task.run(_WORKER[0])


def run_tasks(path: Path, threads: int, workers: int, recipe: RolloutRecipe, tasks: list,
              max_windows: int = 16, journal: Journal | None = None, deadline: float | None = None) -> list[Any]:
    """Run `tasks` in order inline (`workers` <= 1) or on `workers` spawned processes; results in order.

    With a `journal`, tasks it holds are not run again and each result is saved there as it finishes. Past
    `deadline` (a `time.monotonic()` value) no task starts: `StretchSpent` once the running ones are saved.
    """
    from tqdm.auto import tqdm

    todo = [i for i, t in enumerate(tasks) if journal is None or not journal.has(t)]
    done: dict[int, Any] = {}

    def finish(i: int, result) -> None:
        done[i] = result
        if journal is not None:
            journal.put(tasks[i], result)
        bar.update()

    bar = tqdm(total=len(todo), desc="fidelity: model rollouts", unit="task", mininterval=10)
    try:
        if workers <= 1:
            _run_inline(path, threads, recipe, tasks, todo, max_windows, finish, deadline)
        else:
            _run_pool(path, threads, workers, recipe, tasks, todo, max_windows, finish, deadline)
    finally:
        bar.close()
    return [done[i] if i in done else journal.get(t) for i, t in enumerate(tasks)]


def _spent(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _run_inline(path, threads, recipe, tasks, todo, max_windows, finish, deadline) -> None:
    worker = Worker(str(path), threads, recipe, max_windows)
    try:
        for n, i in enumerate(todo):
            if _spent(deadline):
                raise StretchSpent(f"{len(todo) - n} task(s) left")
            finish(i, tasks[i].run(worker))
    finally:
        worker.close()


def _run_pool(path, threads, workers, recipe, tasks, todo, max_windows, finish, deadline) -> None:
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                             initargs=(str(path), threads, recipe, max_windows)) as pool:
        pending = {pool.submit(_run_in_worker, tasks[i]): i for i in todo}
        while pending:
            finished, _ = wait(pending, timeout=30, return_when=FIRST_COMPLETED)
            for future in finished:
                finish(pending.pop(future), future.result())
            if _spent(deadline) and pending:
                cancelled = [f for f in pending if f.cancel()]  # not started; the running ones finish and are saved
                for future in [f for f in pending if f not in cancelled]:
                    finish(pending.pop(future), future.result())
                raise StretchSpent(f"{len(cancelled)} task(s) left")
