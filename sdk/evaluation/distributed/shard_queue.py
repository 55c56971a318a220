"""The driver's loop: one shard in flight per actor, results as they finish, dead actors replaced.

An actor that dies (``RayActorError``: killed, out of memory, its node gone) loses only the shard it was
running; that shard goes back to the queue for another actor until it has seen ``max_retries + 1``
deaths, after which its episodes are reported failed. An exception raised *inside* a shard (a bug or a
bad argument, the same on every actor) is not retried: it propagates to the caller, and so does a model
that fails to load before any shard has finished (a wrong checkpoint path fails on every actor alike).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .worker import EpisodeOutput, Shard


class WorkerStartError(RuntimeError):
    """No Ray actor could load the model (the message holds the actor's exception)."""


class ShardQueue:
    """Runs shards on up to ``num_workers`` actors made by ``make_actor(k)``.

    ``actors`` holds the live actors (tests kill one to check the re-runs); ``deaths`` counts the actors
    lost; ``started`` counts the actors made, replacements included.
    """

    def __init__(self, make_actor: Callable[[int], Any], num_workers: int, max_retries: int) -> None:
        self.make_actor = make_actor
        self.num_workers = num_workers
        self.max_retries = max_retries
        self.actors: list[Any] = []
        self.deaths = 0
        self.started = 0
        self.finished = 0  # shards that came back

    def run(self, shards: list[Shard], on_done: Callable[[EpisodeOutput], None],
            on_failed: Callable[[Shard, str], None], timeout_s: float | None = None) -> None:
        """Run every shard; ``on_done`` gets each episode as it streams back, ``on_failed`` each shard
        that ran out of retries. Raises ``TimeoutError`` when ``timeout_s`` passes first."""
        import ray
        from ray.exceptions import RayActorError

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pending: deque[Shard] = deque(shards)
        in_flight: dict[Any, tuple[Any, Shard]] = {}
        idle: list[Any] = []
        try:
            while pending or in_flight:
                # submit: top the pool up to num_workers (replacing dead actors), one shard per idle actor
                while pending and len(self.actors) < min(self.num_workers, len(pending) + len(in_flight)):
                    idle.append(self._start())
                while pending and idle:
                    actor, shard = idle.pop(), pending.popleft()
                    in_flight[actor.run.remote(shard)] = (actor, shard)
                # wait for the next shard to finish
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=remaining)
                if not ready:
                    left = sorted(i for _, s in in_flight.values() for i in s.indices)
                    raise TimeoutError(f"ray evaluation ran past timeout_s={timeout_s:g}; episodes {left} "
                                       "were still running")
                actor, shard = in_flight.pop(ready[0])
                try:
                    outputs = ray.get(ready[0])
                except RayActorError as err:
                    self._bury(actor)
                    if getattr(err, "actor_init_failed", False) and not self.finished:
                        raise WorkerStartError(f"a Ray worker could not load the model: {_last_line(err)}") from err
                    shard.attempts += 1
                    if shard.attempts > self.max_retries:
                        on_failed(shard, f"{shard.attempts} Ray workers died running it "
                                         f"(max_retries={self.max_retries}); last: {_first_line(err)}")
                    else:
                        pending.append(shard)
                    continue
                idle.append(actor)
                self.finished += 1
                for output in outputs:
                    on_done(output)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Kill every actor: each holds a loaded model."""
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []

    def _start(self) -> Any:
        actor = self.make_actor(self.started)
        self.started += 1
        self.actors.append(actor)
        return actor

    def _bury(self, actor: Any) -> None:
        import ray

        self.deaths += 1
        if actor in self.actors:
            self.actors.remove(actor)
        ray.kill(actor)  # an ActorUnavailableError actor may still be alive; never reuse it


def _last_line(err: BaseException) -> str:
    """The actor's own exception: the last line of Ray's traceback text."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(err).__name__


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"
