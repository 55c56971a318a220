"""``worldstep`` command line: ``rollout``, ``eval``, ``plan``, ``info``, ``stats``, ``bench``, ``serve``, ``train``,
``fidelity``, ``replay`` and ``export-pushsim``.

One module per command (``rollout``, ``evaluation``, ``plan``, ``info``, ``stats``; bench, serve and the
LeRobot commands live with their packages), what they share (``common``, ``checks``, ``view``) and the parser
and ``main`` (``command``).
"""

from __future__ import annotations

from .command import build_parser, main

__all__ = ["build_parser", "main"]
