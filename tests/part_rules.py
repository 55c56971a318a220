"""The part graph `test_parts.py` checks: which top-level parts of a package import which, and which product
module imports research.

A part is ``<root>.X`` for each subpackage or top module ``X`` of the root package (``worldstep.planning``,
``worldstep.envs``, ``worldstep.fidelity``). The root itself (``worldstep/__init__.py``) is the front door, not a
part: an import of a name from it (``from worldstep import make_env``) is an edge to the module the root takes that
name from, read from its ``from .m import name`` lines and its table of lazy exports. Every import counts, those
inside functions too, since a function-level import is an edge the day the function runs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from structure_rules import Tree, all_facts, cycles


def front_door_exports(tree: Tree, root: str) -> dict[str, str]:
    """``{name: module}`` for what the root package re-exports: its ``from .m import a`` lines (anywhere) and its
    module-level string tables of lazy exports (``{"load": ".world"}``)."""
    source = ast.parse(tree.modules[root].read_text())
    exports = {}
    for node in ast.walk(source):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            exports.update({a.asname or a.name: f"{root}.{node.module}" for a in node.names})
    for node in source.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for key, value in zip(node.value.keys, node.value.values):
                if isinstance(key, ast.Constant) and isinstance(value, ast.Constant) and isinstance(value.value, str) \
                        and value.value.startswith("."):
                    exports[key.value] = root + value.value
    return {name: module for name, module in exports.items() if module in tree.modules}


def module_graph(tree: Tree, root: str) -> dict[str, set[str]]:
    """Every module's imports (function-level ones included), a name taken from the root resolved to the module
    the root takes it from."""
    exports = front_door_exports(tree, root)
    g: dict[str, set[str]] = {}
    for name, facts in all_facts(tree).items():
        targets = set()
        for module, names in facts.imports:
            if module == root and names:
                targets |= {exports.get(n, root) for n in names}
            else:
                targets.add(module)
        g[name] = targets - {name}
    return g


def part_of(module: str, root: str) -> str | None:
    """``root.X`` for a module of part X; None for the root itself."""
    parts = module.split(".")
    return ".".join(parts[:2]) if module.startswith(root + ".") else None


def part_graph(g: dict[str, set[str]], root: str) -> dict[str, dict[str, list[str]]]:
    """``{part: {part it imports: ["module -> module", ...]}}``; the root and edges within a part left out."""
    out: dict[str, dict[str, list[str]]] = {}
    for a, targets in g.items():
        pa = part_of(a, root)
        if pa is None:
            continue
        out.setdefault(pa, {})
        for b in sorted(targets):
            pb = part_of(b, root)
            if pb is not None and pb != pa:
                out[pa].setdefault(pb, []).append(f"{a} -> {b}")
    return out


def part_cycles(parts: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Parts that import each other, directly or round a loop (strongly connected components)."""
    return cycles({p: set(targets) for p, targets in parts.items()})


def in_any(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def product_to_research(g: dict[str, set[str]], research: Iterable[str], allowed: Iterable[str] = ()) -> list[str]:
    """``"a -> b"`` for each import of a research module ``b`` by a product module ``a`` (any module not in
    ``research``), except from the modules in ``allowed``."""
    research, allowed = tuple(research), frozenset(allowed)
    return sorted(f"{a} -> {b}" for a, targets in g.items() for b in targets
                  if not in_any(a, research) and in_any(b, research) and a not in allowed)


def unresolved_imports(tree: Tree) -> list[str]:
    """Imports of the tree's own packages that name no module of it (a relative import one level off after a
    move), function-level ones included: the module graph leaves such an edge out, so the rules above cannot."""
    found = []
    for name, path in tree.modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                targets = [".".join(base + ([node.module] if node.module else []))]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            found += [f"{name}:{node.lineno}: {ast.unparse(node)}" for t in targets
                      if (getattr(node, "level", 0) or tree.prefix_of(t)) and t not in tree.modules]
    return found
