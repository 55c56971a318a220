"""The body of one Ray actor: a loaded world model that runs shards of episodes with the local evaluate."""

from __future__ import annotations

import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...config import WorldstepConfig
from ...episodes import EpisodeConfig, EpisodeResult


@dataclass
class Shard:
    """Episodes that one actor call runs together (one vector-env batch when batched).

    ``indices`` are the episodes' positions in the whole evaluation; ``attempts`` counts the actors that
    died running this shard.
    """

    indices: list[int]
    episodes: list[EpisodeConfig]
    attempts: int = 0


@dataclass
class EpisodeOutput:
    """One finished episode as it travels back to the driver: the result and its mp4 bytes.

    Videos travel as bytes because the driver's ``out_dir`` need not exist on the actor's node.
    """

    result: EpisodeResult
    video: bytes | None


class EvalWorker:
    """Loads the world model once, then runs each shard through ``worldstep.evaluate`` (local backend).

    Every shard's env is built as the local path builds it for the whole run (``max_windows`` is the
    longest episode's, which decides when an env reports truncation), so the results equal a local run's:
    the same env, seeds and policy resets, in another process.
    """

    def __init__(self, config: WorldstepConfig, policy: Any, success_fn: Any, batched: bool,
                 record_video: bool, max_windows: int, threads: int) -> None:
        import torch

        from ...world import load

        torch.set_num_threads(threads)
        self.world = load(config)
        self.policy = policy
        self.env_kwargs = {"max_windows": max_windows, "success_fn": success_fn}
        self.batched = batched
        self.record_video = record_video

    def where(self) -> str:
        """``host:pid (device)`` of this actor, for logs and tests."""
        return f"{socket.gethostname()}:{os.getpid()} ({self.world.model.device})"

    def run(self, shard: Shard) -> list[EpisodeOutput]:
        from ...world import make_env, make_vec_env
        from ..local import evaluate_local

        if self.batched:
            env = make_vec_env(self.world, len(shard.episodes), **self.env_kwargs)
        else:
            env = make_env(self.world, **self.env_kwargs)
        try:
            with tempfile.TemporaryDirectory(prefix="worldstep-ray-") as tmp:
                report = evaluate_local(env, self.policy, list(shard.episodes), seed=0, success_fn=None,
                                        out_dir=Path(tmp), batched=self.batched, batch_size=None,
                                        record_video=self.record_video, progress=False)
                outputs = []
                for index, result in zip(shard.indices, report.episodes):
                    video = Path(result.video).read_bytes() if result.video is not None else None
                    result.index, result.video = index, None
                    outputs.append(EpisodeOutput(result, video))
        finally:
            env.close()
        return outputs
