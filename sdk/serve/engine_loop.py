"""The one thread that touches the served model, and the window in which it gathers steps into one batch.

Connection threads never call the model: they hand jobs to this loop and wait on a future. A step job opens a
batch; steps that arrive from other sessions within ``max_wait_s`` (at most ``max_batch`` of them) join it,
and the whole batch runs as ONE engine call (``worldstep.envs.batched.step_batch``). The wait is skipped when
every open session is already in the batch, so a lone client pays no batching delay. Other jobs (reset, open,
fork, close) run one at a time, in arrival order.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from worldstep.envs.batched import step_batch

__all__ = ["EngineLoop"]


@dataclass
class _StepJob:
    env: Any
    actions: np.ndarray
    future: Future = field(default_factory=Future)


@dataclass
class _CallJob:
    fn: Callable[[], Any]
    future: Future = field(default_factory=Future)


_STOP = object()


class EngineLoop:
    """Run jobs on one daemon thread; ``step`` jobs of different sessions batch within ``max_wait_s``.

    ``open_sessions()`` says how many sessions could send a step now (the wait ends early once they all have).
    ``batches`` counts the engine calls the loop made for steps; ``batch_sizes`` and ``batch_seconds`` hold the
    sizes and wall times of the last ``history`` of them (a server runs for days, so they are bounded): a round's
    time beyond its engine call is the serving (the round trip, the wait for the batch).
    """

    def __init__(self, max_batch: int, max_wait_s: float, open_sessions: Callable[[], int],
                 history: int = 1024) -> None:
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.open_sessions = open_sessions
        self.batches = 0
        self.batch_sizes: deque[int] = deque(maxlen=history)
        self.batch_seconds: deque[float] = deque(maxlen=history)
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="worldstep-serve-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Finish every job already queued, then end the thread."""
        self._jobs.put(_STOP)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)

    def call(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` run on the loop's thread; its exception is raised here."""
        job = _CallJob(fn)
        self._jobs.put(job)
        return job.future.result()

    def step(self, env: Any, actions: np.ndarray) -> tuple:
        """``env.step(actions)``, batched with other sessions' steps; the env's own error is raised here."""
        job = _StepJob(env, actions)
        self._jobs.put(job)
        outcome = job.future.result()
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    # --- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        carry = None
        while True:
            job, carry = (carry if carry is not None else self._jobs.get()), None
            if job is _STOP:
                return
            if isinstance(job, _CallJob):
                _settle(job.future, job.fn)
                continue
            batch, carry = self._gather(job)
            self._run_batch(batch)

    def _gather(self, first: _StepJob) -> tuple[list[_StepJob], Any]:
        """The batch ``first`` opens, and the job that closed it early (a non-step, or a second step of one env)."""
        batch = [first]
        deadline = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch:
            wait = deadline - time.monotonic() if self.open_sessions() > len(batch) else 0.0
            try:
                job = self._jobs.get(timeout=wait) if wait > 0 else self._jobs.get_nowait()
            except queue.Empty:
                break
            if not isinstance(job, _StepJob) or any(job.env is other.env for other in batch):
                return batch, job
            batch.append(job)
        return batch, None

    def _run_batch(self, batch: list[_StepJob]) -> None:
        self.batches += 1
        self.batch_sizes.append(len(batch))
        started = time.perf_counter()
        try:
            outcomes = step_batch([job.env for job in batch], [job.actions for job in batch])
        except Exception as err:  # an engine failure: every waiting client gets it, the loop goes on
            outcomes = [err] * len(batch)
        self.batch_seconds.append(time.perf_counter() - started)
        for job, outcome in zip(batch, outcomes):
            job.future.set_result(outcome)


def _settle(future: Future, fn: Callable[[], Any]) -> None:
    try:
        future.set_result(fn())
    except Exception as err:
        future.set_exception(err)
