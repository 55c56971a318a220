"""What an evaluation runs and reports: episode configs, per-episode results and the report, shared by the
local runner and the Ray backend.

``EpisodeResult`` is the one per-episode result: a run that reports more about an episode (the truth
comparison, the planner's closed loop, the fidelity report's episodes) holds an ``EpisodeResult`` as its
``episode`` and adds only its own fields."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from worldstep.engine.settings import ConfigError, NonNegativeInt, PositiveInt, StrictModel

from .lerobot.start_states import DatasetStart

__all__ = ["EpisodeConfig", "EpisodeResult", "EvalReport", "EvaluationFailed", "default_windows", "episode_configs",
           "reset_options"]


class EvaluationFailed(RuntimeError):
    """Every episode of an evaluation failed; its report (``status: "failed"``, the first error) is written."""


class EpisodeConfig(StrictModel):
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
    start: DatasetStart | None = None
    """a recorded start: a LeRobot dataset's episode and frame, its task as the prompt (unless ``prompt`` is
    given) and optionally its state (``worldstep.lerobot.start_states.DatasetStart``)"""


@dataclass
class EpisodeResult:
    """What one episode did; ``video`` is the mp4 path (None when not recorded). ``success`` is the episode's
    verdict as its runner judges it (an env's success judge; with a simulator beside the model, the
    simulator's)."""

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

    @classmethod
    def of_env(cls, env: Any, *, seed: int | None, index: int = 0,
               options: dict[str, Any] | None = None) -> EpisodeResult:
        """A new episode of ``env``: its prompt and domain are the reset ``options``' or the env's own."""
        inner = getattr(env, "unwrapped", env)
        given = options or {}
        return cls(index=index, seed=-1 if seed is None else seed,
                   prompt=given.get("prompt") or getattr(inner, "prompt", None),
                   domain_id=given.get("domain_id", getattr(inner, "domain_id", None)))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

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
    """``interrupted``: Ctrl-C stopped the run; ``episodes`` holds the ones that finished (``report.json`` says
    ``failed`` when every episode failed, see :attr:`all_failed`)"""
    windows_completed: int = 0
    """windows generated in all, an interrupted episode's included"""
    run: dict[str, Any] = field(default_factory=dict)
    """what the caller records about the run (the CLI: command, policy, seed, prompt, ``--set`` overrides)"""
    corrected_success_rate: dict[str, Any] | None = None
    """the success rate corrected by paired outcomes (``evaluate(paired_outcomes=...)``; None: none given)"""

    @property
    def all_failed(self) -> bool:
        """No episode ran to its end: a policy that cannot act must not read as a 0% success rate."""
        return bool(self.episodes) and all(e.status == "failed" for e in self.episodes)

    @property
    def first_error(self) -> str | None:
        return next((e.error for e in self.episodes if e.status == "failed"), None)

    def check_not_all_failed(self, report_path: Any) -> None:
        """Raise :class:`EvaluationFailed` when every episode failed (after the report is written)."""
        if self.status == "ok" and self.all_failed:
            raise EvaluationFailed(f"all {len(self.episodes)} episodes failed; first error: {self.first_error}; "
                                   f"report {report_path}")

    @property
    def success_rate(self) -> float:
        return float(np.mean([e.success for e in self.episodes])) if self.episodes else 0.0

    @property
    def mean_return(self) -> float:
        return float(np.mean([e.episode_return for e in self.episodes])) if self.episodes else 0.0

    def to_dict(self) -> dict[str, Any]:
        frames = sum(e.frames for e in self.episodes)
        failed = self.status == "ok" and self.all_failed
        return {
            "status": "failed" if failed else self.status,
            "error": self.first_error if failed else None,
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
            **({} if self.corrected_success_rate is None else {"corrected_success_rate": self.corrected_success_rate}),
            "episodes": [e.to_dict() for e in self.episodes],
        }


def reset_options(episode: EpisodeConfig) -> dict[str, Any]:
    """The env reset options of an episode (its image read from disk)."""
    from .world import read_image

    options: dict[str, Any] = {"prompt": episode.prompt, "domain_id": episode.domain_id}
    if episode.image is not None:
        options["image"] = read_image(episode.image)
    if episode.start is not None:
        options = {**episode.start.options(), **{k: v for k, v in options.items() if v is not None}}
    return {k: v for k, v in options.items() if v is not None}


def episode_configs(episodes: int | Sequence[dict | EpisodeConfig], seed: int,
                    max_windows: int | None = None) -> list[EpisodeConfig]:
    """Episodes from a count or a list of dicts/configs; a missing seed is ``seed + index``, a missing
    ``max_windows`` the env's (``max_windows``)."""
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
    inner = env_or_world.envs[0] if hasattr(env_or_world, "envs") else env_or_world
    try:
        windows = inner.get_wrapper_attr("max_windows")  # the WindowLimit's
    except AttributeError:
        windows = None
    if windows is None and getattr(env_or_world, "spec", None) is not None:
        windows = env_or_world.spec.max_episode_steps
    return windows
