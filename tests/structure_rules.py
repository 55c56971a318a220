"""The rules `test_structure.py` checks, over any tree of packages (the repository, or a synthetic one a test
writes to break a rule on purpose).

Imports are read from the source, lazy ones included: a module-level table of relative module names that an
``importlib.import_module(TABLE[name], __name__)`` resolves (a package's lazy exports) counts as an import of
every module it names. Any other dynamic import is a violation unless its argument is a string literal (then
it is an edge like any import) or the module is listed as importing user code.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Tree:
    """Packages by folder: ``{folder: import prefix}`` under ``root``."""

    root: Path
    packages: dict[str, str]
    user_code_importers: frozenset[str] = frozenset()  # modules that import what the user names (plugins)
    relative_inside: frozenset[str] = frozenset()  # folders whose modules import each other relatively only
    modules: dict[str, Path] = field(init=False)

    def __post_init__(self) -> None:
        self.modules = {}
        for folder, prefix in self.packages.items():
            for path in sorted((self.root / folder).rglob("*.py")):
                parts = list(path.relative_to(self.root / folder).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                self.modules[".".join([prefix, *parts])] = path

    def prefix_of(self, module: str) -> bool:
        return any(module == p or module.startswith(p + ".") for p in self.packages.values())


@dataclass
class ModuleFacts:
    """What one module imports, and the rule breaks found in it."""

    imports: list[tuple[str, list[str]]] = field(default_factory=list)  # (module, names taken from it)
    aliases: set[str] = field(default_factory=set)  # local names bound to a package module
    dynamic: list[str] = field(default_factory=list)
    private_through_module: list[str] = field(default_factory=list)
    finalizers_bound_to_owner: list[str] = field(default_factory=list)


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def _resolve(package: str, module: str | None, level: int) -> str:
    if not level:
        return module or ""
    base = package.split(".")
    base = base[: len(base) - level + 1]
    return ".".join(base + ([module] if module else []))


def _string_tables(tree: ast.Module) -> dict[str, list[str]]:
    """Module-level ``NAME = {key: "module", ...}`` tables of string values."""
    tables = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Dict) and value.values and all(
                    isinstance(v, ast.Constant) and isinstance(v.value, str) for v in value.values):
                tables[node.targets[0].id] = [v.value for v in value.values]
    return tables


def _is_import_module(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id in {"import_module", "__import__"})


def _dynamic_targets(call: ast.Call, tables: dict[str, list[str]], package: str) -> list[str] | None:
    """Modules an import_module call can load, or None when the source does not say."""
    if not call.args:
        return None
    arg = call.args[0]
    relative_to = package if len(call.args) > 1 else ""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        names = [arg.value]
    elif isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Name) and arg.value.id in tables:
        names = tables[arg.value.id]
    else:
        return None
    out = []
    for n in names:
        level = len(n) - len(n.lstrip("."))
        out.append(_resolve(relative_to, n.lstrip(".") or None, level) if level else n)
    return out


def _root_name(node: ast.expr) -> tuple[str | None, list[str]]:
    chain = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    return (node.id if isinstance(node, ast.Name) else None), chain[::-1]


def _is_finalize(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr == "finalize") or (isinstance(f, ast.Name) and f.id == "finalize")


def facts(tree_: Tree, name: str, path: Path) -> ModuleFacts:
    package = _package_of(name, path)
    tree = ast.parse(path.read_text())
    tables = _string_tables(tree)
    out = ModuleFacts()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if tree_.prefix_of(a.name):
                    out.imports.append((a.name, []))
                    if a.asname:
                        out.aliases.add(a.asname)
                    else:
                        out.aliases.add(a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(package, node.module, node.level)
            if not tree_.prefix_of(target):
                continue
            names = []
            for a in node.names:
                if f"{target}.{a.name}" in tree_.modules:
                    out.imports.append((f"{target}.{a.name}", []))
                    out.aliases.add(a.asname or a.name)
                else:
                    names.append(a.name)
            out.imports.append((target, names))
        elif isinstance(node, ast.Call) and _is_import_module(node):
            targets = _dynamic_targets(node, tables, package)
            if targets is None:
                if name not in tree_.user_code_importers:
                    out.dynamic.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
            else:
                out.imports += [(t, []) for t in targets if tree_.prefix_of(t)]
        elif isinstance(node, ast.Call) and _is_finalize(node):
            bound = [a for a in node.args[1:] if (isinstance(a, ast.Name) and a.id == "self") or (
                isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id == "self"
                and a is node.args[1])]
            if bound:
                out.finalizers_bound_to_owner.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "_parent", None), ast.Attribute):
            root, chain = _root_name(node)
            if root in out.aliases and any(p.startswith("_") and not p.startswith("__") for p in chain):
                out.private_through_module.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    out.private_through_module = sorted(set(out.private_through_module))
    out.imports = [(m, n) for m, n in out.imports if m in tree_.modules]
    return out


def all_facts(tree_: Tree) -> dict[str, ModuleFacts]:
    return {name: facts(tree_, name, path) for name, path in tree_.modules.items()}


def graph(tree_: Tree, facts_: dict[str, ModuleFacts] | None = None) -> dict[str, set[str]]:
    facts_ = facts_ if facts_ is not None else all_facts(tree_)
    return {name: {m for m, _ in f.imports if m != name} for name, f in facts_.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    found, index, low, stack, on_stack, counter = [], {}, {}, [], set(), [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in g:
        if v not in index:
            visit(v)
    return found


def private_imports(facts_: dict[str, ModuleFacts]) -> list[str]:
    return [f"{name} imports {target}.{n}" for name, f in facts_.items() for target, names in f.imports
            for n in names if target != name and n.startswith("_") and not n.startswith("__")]


def absolute_self_imports(tree_: Tree) -> list[str]:
    """Imports of a module's own package spelled absolutely, in the folders that import themselves relatively
    (one import style per package; the engine's relative imports keep it standalone)."""
    found = []
    for folder in sorted(tree_.relative_inside):
        prefix = tree_.packages[folder]
        for path in sorted((tree_.root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
                for name in names:
                    if name == prefix or name.startswith(prefix + "."):
                        found.append(f"{path.relative_to(tree_.root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def violations(tree_: Tree) -> dict[str, list]:
    """Every rule break of the tree, by rule (empty lists: none)."""
    facts_ = all_facts(tree_)
    return {
        "cycles": cycles(graph(tree_, facts_)),
        "private imports": private_imports(facts_),
        "dynamic imports": [d for f in facts_.values() for d in f.dynamic],
        "private attributes through a module": [p for f in facts_.values() for p in f.private_through_module],
        "finalizers bound to their owner": [b for f in facts_.values() for b in f.finalizers_bound_to_owner],
        "absolute imports of the own package": absolute_self_imports(tree_),
    }
