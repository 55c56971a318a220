"""No lazy export tables: a package ``__init__`` that defers a heavy import (torch, gymnasium) does it with an
``import`` statement a reader and every tool can see, never by resolving a name through a table of module strings
(``importlib.import_module(_LAZY[name], __name__)``) or a computed ``getattr``. Checked over every ``__init__.py``
of sdk/, envs/ and engine/, and shown failing on injected tables."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
FOLDERS = ("sdk", "envs", "engine")
DYNAMIC_IMPORTS = {"import_module", "__import__"}


def _is_name_table(value: ast.expr) -> bool:
    """A dict, list, tuple or set literal whose every key or element is a string."""
    items = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", None)
    if not isinstance(value, (ast.Dict, ast.List, ast.Tuple, ast.Set)) or not items:
        return False
    return all(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items)


def lazy_tables(path: Path, label: str) -> list[str]:
    """``label:line: why`` for every way a module-level ``__getattr__`` of ``path`` resolves a name other than by an
    import statement: a dynamic import call, ``getattr`` of a computed name, or a module-level table of names."""
    tree = ast.parse(path.read_text())
    tables = {t.id for node in tree.body if isinstance(node, ast.Assign) and _is_name_table(node.value)
              for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"):
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if called in DYNAMIC_IMPORTS:
                    found.append(f"{label}:{node.lineno}: dynamic import {ast.unparse(node)}")
                elif called == "getattr" and len(node.args) > 1 and not isinstance(node.args[1], ast.Constant):
                    found.append(f"{label}:{node.lineno}: computed getattr {ast.unparse(node)}")
            elif isinstance(node, ast.Name) and node.id in tables:
                found.append(f"{label}:{node.lineno}: table of names {node.id}")
    return found


def test_no_package_init_has_a_lazy_table():
    inits = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("__init__.py"))]
    assert len(inits) > 10
    found = [hit for p in inits for hit in lazy_tables(p, str(p.relative_to(ROOT)))]
    assert not found, found


EXPLICIT = '''
    from .light import Config

    def __getattr__(name):
        if name == "Model":
            from .heavy import Model

            return Model
        raise AttributeError(name)
'''


@pytest.mark.parametrize(("init", "expected"), [
    ('''
    import importlib
    _LAZY = {"Model": ".heavy"}
    def __getattr__(name):
        if name in _LAZY:
            return getattr(importlib.import_module(_LAZY[name], __name__), name)
        raise AttributeError(name)
    ''', ["table of names _LAZY", "computed getattr", "dynamic import", "table of names _LAZY"]),
    ('''
    _NAMES = ("Model", "Runner")
    def __getattr__(name):
        if name in _NAMES:
            from . import heavy

            return getattr(heavy, name)
        raise AttributeError(name)
    ''', ["table of names _NAMES", "computed getattr"]),
    ('''
    def __getattr__(name):
        return __import__("pkg.heavy", fromlist=[name]).Model
    ''', ["dynamic import"]),
])
def test_the_rule_fails_on_an_injected_table(tmp_path, init, expected):
    clean = tmp_path / "clean.py"
    clean.write_text(textwrap.dedent(EXPLICIT))
    assert lazy_tables(clean, "clean.py") == []
    broken = tmp_path / "broken.py"
    broken.write_text(textwrap.dedent(init))
    found = lazy_tables(broken, "broken.py")
    assert sorted(hit.split(": ", 1)[1].split(" ")[0] for hit in found) == sorted(e.split(" ")[0] for e in expected)
