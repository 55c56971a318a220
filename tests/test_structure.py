"""The shape of the code: no import cycle, no private imports across modules, dependencies one way, engine files
under 300 lines, and records that hold no reference up to their owner."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

ROOT = Path(__file__).parent.parent
PACKAGES = {"sdk": "worldstep", "envs": "worldstep.envs", "engine": "worldstep.engine"}


def _modules() -> dict[str, Path]:
    """Every worldstep module by its import name."""
    out = {}
    for folder, prefix in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([prefix, *parts])] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(imported worldstep module, names taken from it) for every import in the module, lazy ones included."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("worldstep")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("worldstep"):
                continue
            names = [a.name for a in node.names]
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            found += [(m, []) for m in submodules]
            found.append((target, [n for n in names if f"{target}.{n}" not in modules]))
    return [(m, n) for m, n in found if m in modules]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {m for m, _ in _imports(name, path, modules) if m != name} for name, path in modules.items()}


def test_the_module_walk_sees_the_whole_package():
    modules = _modules()
    assert {"worldstep", "worldstep.world", "worldstep.envs.episode", "worldstep.engine.kv.table",
            "worldstep.engine.models.cosmos3.model"} <= set(modules)
    assert "worldstep.engine.kv" in _graph()["worldstep.engine.models.cosmos3.session"]


def test_no_import_cycle_among_worldstep_modules():
    graph = _graph()
    cycles, index, low, stack, on_stack, counter = [], {}, {}, [], set(), [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_no_module_imports_a_private_name_from_another():
    modules = _modules()
    offenders = [f"{name} imports {target}.{n}" for name, path in modules.items()
                 for target, names in _imports(name, path, modules) for n in names
                 if target != name and n.startswith("_") and not n.startswith("__")]
    assert not offenders, offenders


def test_dependencies_point_one_way():
    graph = _graph()

    def layer(module: str) -> str:
        if module.startswith("worldstep.engine"):
            return "engine"
        return "envs" if module.startswith("worldstep.envs") else "sdk"

    order = {"engine": 0, "envs": 1, "sdk": 2}
    upward = [f"{a} -> {b}" for a, targets in graph.items() for b in targets if order[layer(b)] > order[layer(a)]]
    assert not upward, upward
    core = [m for m in graph if m.startswith(("worldstep.engine.kv", "worldstep.engine.windowing",
                                                 "worldstep.engine.scheduler"))]
    model_code = [f"{m} -> {t}" for m in core for t in graph[m] if ".models" in t or ".vae" in t]
    assert not model_code, model_code


def test_no_engine_file_reaches_300_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / "engine").rglob("*.py")}
    assert max(sizes.values()) < 300, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]


def test_records_hold_no_reference_up_to_their_owner(tmp_path):
    """A session and a decoder stream are records: the model and the decoder have the verbs."""
    import yaml
    from worldstep.engine.models.cosmos3 import Cosmos3WorldModel, RolloutKnobs, build_checkpoint

    arch = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())["model"]["architecture"]
    model = Cosmos3WorldModel.from_pretrained(build_checkpoint(tmp_path / "tiny", arch), device="cpu",
                                              height=32, width=32)
    owners = (model, model.kv, model.kv.table, model.decoder, model.scheduler, model.runner)
    with model.session(np.zeros((32, 32, 3), np.uint8), "go", 0, knobs=RolloutKnobs(num_steps=1)) as session:
        model.step([session], [np.zeros((4, model.spec.action_dim), np.float32)])
        for record in (session, session.decode_stream):
            held = list(vars(record).values())
            assert not any(value is owner for value in held for owner in owners), type(record).__name__
            assert not any(callable(getattr(record, verb, None)) for verb in ("step", "close", "fork", "decode"))
