"""A user's own policy named on the command line: ``module:attr`` (importable) or ``path/to/file.py:attr``.

``worldstep rollout/eval/plan --policy my_pkg.agents:policy`` must run the same policy a script passes to
``worldstep.evaluate``; this module finds it. The attribute is a policy object, a plain function
``obs -> actions``, or a class built with the action shape ``(chunk_size, action_width)``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

__all__ = ["is_user_spec", "load_user_policy"]

ALLOWED = "module:attr (importable) or path/to/file.py:attr naming a policy, a function obs -> actions, or a class"


def is_user_spec(spec: str) -> bool:
    """Whether ``spec`` names a user's policy (``a:b`` that is not ``replay:PATH``)."""
    source, colon, attr = spec.rpartition(":")
    return bool(colon and source and attr) and not spec.startswith("replay:")


def load_user_policy(spec: str, shape: tuple[int, int]) -> Any:
    """The object ``spec`` names (a class is instantiated with ``shape``); a ``ValueError`` naming ``--policy``
    when the module, file or attribute cannot be found."""
    source, _, attr = spec.rpartition(":")
    try:
        module = _load_file(source) if source.endswith(".py") else importlib.import_module(source)
        found = getattr(module, attr)
    except (ImportError, AttributeError, FileNotFoundError, SyntaxError) as err:
        raise ValueError(f"--policy {spec!r} is invalid: {type(err).__name__}: {err}; allowed: {ALLOWED}") from None
    return found(shape) if isinstance(found, type) else found


def _load_file(path: str):
    """Import a ``.py`` file by path under a private module name (its folder goes first on ``sys.path`` while it
    imports, so its own sibling imports work)."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"policy file {path!r} does not exist")
    name = f"worldstep_user_policy_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.resolve().parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(file.resolve().parent))
    return module
