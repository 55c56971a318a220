"""No module reaches into another object's private members: a ``_name`` is read only on ``self`` (or ``cls``), and
only where the class that reads it defines it. A subclass calling its base's helpers, or a cache calling its
table's, hides a coupling the public API does not show (the paged KV cache once called six private methods of
the stream table it subclassed). Checked over the paged KV cache, and shown failing on an injected violation."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
CHECKED = ("engine/kv",)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_in(cls: ast.ClassDef) -> set[str]:
    """Private names a class defines: its methods and class attributes, and what its methods assign on self."""
    names = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            if isinstance(t, ast.Name):
                names.add(t.id)
            elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"):
                names.add(t.attr)
    return {n for n in names if _private(n)}


def private_reaches(path: Path, label: str) -> list[str]:
    """``label:line: expr`` for every private member read on something other than self/cls, or on self/cls
    without the enclosing class defining it."""
    found = []

    def visit(node: ast.AST, owned: set[str] | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, _defined_in(child))
                continue
            if isinstance(child, ast.Attribute) and _private(child.attr):
                mine = isinstance(child.value, ast.Name) and child.value.id in ("self", "cls")
                if not mine or owned is None or child.attr not in owned:
                    found.append(f"{label}:{child.lineno}: {ast.unparse(child)}")
            visit(child, owned)

    visit(ast.parse(path.read_text()), None)
    return found


def _checked_files() -> list[tuple[Path, str]]:
    return [(p, str(p.relative_to(ROOT))) for folder in CHECKED for p in sorted((ROOT / folder).rglob("*.py"))]


def test_the_kv_cache_reaches_into_no_private_member():
    found = [hit for path, label in _checked_files() for hit in private_reaches(path, label)]
    assert not found, found


CLEAN = """
    class Table:
        def __init__(self):
            self._rows = {}
        def reserve(self, key):
            return self._row(key)
        def _row(self, key):
            return self._rows.get(key)

    class Cache:
        def __init__(self):
            self.table = Table()
            self._lock = None
        def append(self, key):
            with self._lock:
                return self.table.reserve(key)
"""


@pytest.mark.parametrize(("injected", "expected"), [
    ("self.table._row(key)", "self.table._row"),  # a holder calls its part's helper
    ("self._row(key)", "self._row"),  # a subclass-style call of a helper this class does not define
    ("self.table._rows", "self.table._rows"),  # a part's private state read from outside
])
def test_the_rule_fails_on_an_injected_private_reach(tmp_path, injected, expected):
    clean = tmp_path / "clean.py"
    clean.write_text(textwrap.dedent(CLEAN))
    assert private_reaches(clean, "clean.py") == []
    broken = tmp_path / "broken.py"
    broken.write_text(textwrap.dedent(CLEAN).replace("return self.table.reserve(key)", f"return {injected}"))
    assert [hit.split(": ", 1)[1] for hit in private_reaches(broken, "broken.py")] == [expected]
