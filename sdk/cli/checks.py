"""What a ``worldstep`` command checks before it loads a model, and the summary it leaves behind.

Loading a model takes seconds to minutes; a typo must not cost that. Every check here reads only flags,
files and the config, and raises a one-line ``ValueError``/``FileNotFoundError`` naming the flag, the value
and what is allowed. ``RunRecord`` writes the command's summary JSON (atomically), also when the run is
interrupted or fails, so a summary never describes a run other than the last one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..config import ConfigError, WorldstepConfig
from ..outputs import check_output_path, write_json

SUCCESS_SPECS = ("sim", "none", "module:function")


class RunInterrupted(Exception):
    """Ctrl-C stopped a command; the message is the one line the CLI prints (what was written, and where)."""


def parse_set(items: list[str]) -> dict[str, Any]:
    """``--set`` pairs as config overrides: ``KEY=VALUE`` (a field of one section, ``num_steps=2``) or
    ``SECTION.KEY=VALUE`` (``rollout.num_steps=2``, the form error messages print); values are YAML scalars."""
    sections = tuple(WorldstepConfig.model_fields)
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r} is invalid; allowed: KEY=VALUE or SECTION.KEY=VALUE, "
                             "e.g. --set num_steps=2")
        parsed = yaml.safe_load(value) if value else ""
        section, dot, field = key.partition(".")
        if not dot:
            overrides[key] = parsed
        elif section in sections and field and "." not in field:
            overrides.setdefault(section, {})[field] = parsed
        else:
            raise ConfigError(f"--set {item!r} is invalid: {key!r} is not SECTION.KEY; allowed sections: "
                              f"{', '.join(sections)} (e.g. --set rollout.num_steps=2)")
    return overrides


def success_judge(spec: str | None, config: WorldstepConfig) -> str | Callable[[np.ndarray], bool] | None:
    """The env's ``success_fn`` for ``--success``: ``sim`` (the simulator's pixel judge), ``none``, or
    ``module:function`` (an importable ``frames -> bool``); None leaves the env's default (``sim`` when the
    config names a simulator, else none)."""
    if spec is None or spec == "none":
        return spec
    if spec == "sim":
        if config.env.simulator is None:
            raise ValueError(f"--success sim is invalid for config {config.model.name!r}: its env.simulator is "
                             "None; allowed: none or module:function (or a config with a simulator, e.g. "
                             "--env worldstep/Pusher-v0)")
        return spec
    module, colon, name = spec.partition(":")
    if not colon or not module or not name:
        raise ValueError(f"--success {spec!r} is invalid; allowed: one of {SUCCESS_SPECS}")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"--success {spec!r} is invalid: {type(err).__name__}: {err}; allowed: an importable "
                         "module:function taking a window's frames (chunk, H, W, 3) and returning a bool") from None
    if not callable(fn):
        raise ValueError(f"--success {spec!r} is invalid: {name} is not callable")
    return fn


def success_name(spec: str | None, config: WorldstepConfig) -> str:
    """What ``--success`` resolves to, for summaries."""
    if spec is not None:
        return spec
    return "sim" if config.env.simulator is not None else "none"


def check_image_flag(path: str | None) -> None:
    """``--image``: an image file that reads as an ``(H, W, 3)`` uint8 frame."""
    if path is None:
        return
    from worldstep.engine.checks import check_image

    from ..world import read_image

    check_image(f"--image {path!r}", read_image(path))


def check_replay_length(policy: Any, windows: int, spec: str) -> None:
    """A replay policy must hold at least ``windows`` windows: a short file would end the run early."""
    held = getattr(policy, "num_windows", None)
    if held is not None and held < windows:
        raise ValueError(f"--policy {spec} holds {held} windows; --windows {windows} is invalid; allowed: "
                         f"--windows <= {held}")


def check_episodes(data: Any) -> list[dict[str, Any]]:
    """An episodes YAML (a list, or a mapping with an ``episodes`` list) checked entry by entry."""
    from ..episodes import EpisodeConfig
    from ..world import read_image

    episodes = data.get("episodes") if isinstance(data, dict) else data
    if not isinstance(episodes, list) or not episodes:
        raise ValueError("episodes file is invalid; allowed: a non-empty list of episodes, or a mapping with an "
                         "'episodes' list (keys: seed, prompt, domain_id, image, max_windows)")
    for i, episode in enumerate(episodes):
        if not isinstance(episode, dict):
            raise ValueError(f"episodes[{i}] = {episode!r} is invalid; allowed: a mapping")
        try:
            checked = EpisodeConfig(**episode)
        except ConfigError as err:
            raise type(err)("\n".join(f"episodes[{i}].{line}" for line in str(err).splitlines())) from None
        if checked.image is not None:
            read_image(checked.image)
    return episodes


class RunRecord:
    """The summary JSON of one command: ``"status": "ok"`` when it finished, ``"interrupted"`` when Ctrl-C
    stopped it, ``"failed"`` when an error did (with the windows completed and the reason)."""

    def __init__(self, path: str | Path, field: str, **run: Any) -> None:
        self.path = check_output_path(path, field)
        self.run = run
        self.windows_completed = 0

    def window_done(self) -> None:
        self.windows_completed += 1

    def finish(self, **figures: Any) -> Path:
        return write_json(self.path, {"status": "ok", **self.run, **figures})

    @contextmanager
    def guard(self, outputs: str) -> Iterator[RunRecord]:
        """Write an ``interrupted`` summary if the body raises; Ctrl-C becomes ``RunInterrupted``."""
        try:
            yield self
        except KeyboardInterrupt:
            self._stopped("interrupted", "KeyboardInterrupt")
            raise RunInterrupted(f"interrupted after {self.windows_completed} windows; {outputs}; "
                                 f"summary {self.path}") from None
        except Exception as err:
            self._stopped("failed", f"{type(err).__name__}: {err}")
            raise

    def _stopped(self, status: str, reason: str) -> None:
        write_json(self.path, {"status": status, "reason": reason, **self.run,
                               "windows_completed": self.windows_completed, "video": None})
