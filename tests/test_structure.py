"""The shape of the code: no import cycle (lazy imports included), no dynamic import the test cannot read, no
private name reached across modules, dependencies one way, a standalone engine, engine files under 300 lines,
and records that hold no reference up to their owner. Every rule is also run over a synthetic package that
breaks it, so the test is shown to fail."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from structure_rules import Tree, cycles, graph, violations

ROOT = Path(__file__).parent.parent
PACKAGES = {"sdk": "worldstep", "envs": "worldstep.envs", "engine": "worldstep.engine"}
# Modules that import what the user or a table of module:function strings names: the CLI's --success hook
# (user code), --policy module:attr (worldstep.policies.user) and the bench dispatcher (its `_BENCHES` table; test_bench
# runs every entry).
USER_CODE_IMPORTERS = frozenset({"worldstep.cli.checks", "worldstep.bench.cli", "worldstep.policies.user"})
TREE = Tree(ROOT, PACKAGES, USER_CODE_IMPORTERS, relative_inside=frozenset({"engine"}))


def _graph() -> dict[str, set[str]]:
    return graph(TREE)


def test_the_module_walk_sees_the_whole_package():
    assert {"worldstep", "worldstep.world", "worldstep.envs.episode", "worldstep.engine.kv.table",
            "worldstep.engine.models.cosmos3.model"} <= set(TREE.modules)
    g = _graph()
    assert "worldstep.engine.kv" in g["worldstep.engine.session"]
    # lazy exports count as imports: the tables are resolved
    assert "worldstep.engine.models.cosmos3.architecture" in g["worldstep.engine.models.cosmos3"]
    assert "worldstep.world" in g["worldstep"] and "worldstep.envs.episode" in g["worldstep.envs"]


@pytest.mark.parametrize("rule", ["cycles", "private imports", "dynamic imports",
                                  "private attributes through a module", "finalizers bound to their owner",
                                  "absolute imports of the own package"])
def test_the_package_keeps_the_rule(rule):
    found = violations(TREE)[rule]
    assert not found, f"{rule}: {found}"


def test_importing_the_engine_loads_neither_gymnasium_nor_the_envs():
    code = ("import sys, worldstep.engine.kv.allocator, worldstep.engine.models.cosmos3.model\n"
            "bad = [m for m in sys.modules if m.split('.')[0] == 'gymnasium' or m.startswith('worldstep.envs')]\n"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    both_orders = ("import gymnasium as gym, worldstep; assert 'worldstep/Tiny-v0' in gym.registry\n"
                   "import importlib, sys\n")
    subprocess.run([sys.executable, "-c", both_orders], check=True)
    late = "import worldstep, gymnasium as gym; assert 'worldstep/Tiny-v0' in gym.registry"
    subprocess.run([sys.executable, "-c", late], check=True)


# --- the rules, shown to fail on injected violations ------------------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Tree:
    for rel, text in files.items():
        path = tmp_path / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return Tree(tmp_path, {"pkg": "pkg"})


CLEAN = {
    "__init__.py": """
        import importlib
        _LAZY = {"Table": ".table"}
        def __getattr__(name):
            return getattr(importlib.import_module(_LAZY[name], __name__), name)
    """,
    "table.py": """
        class Table:
            def keys(self):
                return self._keys()
            def _keys(self):
                return []
    """,
    "user.py": """
        import weakref
        from pkg import table
        class Decoder:
            def open(self, session, ledger):
                session.release = weakref.finalize(session, ledger.discard, 1)
                return table.Table().keys()
    """,
}


def test_a_clean_synthetic_package_passes(tmp_path):
    tree = _package(tmp_path, CLEAN)
    assert all(not v for v in violations(tree).values()), violations(tree)
    assert graph(tree)["pkg"] == {"pkg.table"}  # the lazy table resolved


@pytest.mark.parametrize(("rule", "files"), [
    ("cycles", {"table.py": "from pkg import Table as _T  # through the lazy table, back to pkg.table\n"}),
    ("dynamic imports", {"user.py": "import importlib\ndef load(name):\n    return importlib.import_module(name)\n"}),
    ("private attributes through a module", {"user.py": "from pkg import table\nkeys = table.Table._keys\n"}),
    ("private imports", {"user.py": "from pkg.table import _helper\n"}),
    ("finalizers bound to their owner", {"user.py": """
        import weakref
        class Decoder:
            def open(self, session):
                session.release = weakref.finalize(session, self._release_slot, 1)
            def _release_slot(self, i):
                pass
    """}),
])
def test_each_rule_fails_on_an_injected_violation(tmp_path, rule, files):
    tree = _package(tmp_path, {**CLEAN, **files})
    found = violations(tree)
    assert found[rule], f"{rule} not caught: {found}"
    assert all(not v for k, v in found.items() if k != rule and k != "private imports"), found


def test_one_import_style_inside_a_relative_package(tmp_path):
    """A folder that imports itself relatively (the engine) is caught spelling its own package absolutely, in a
    function too; the same files with the import made relative pass."""
    lazy = {"lazy.py": "def load():\n    from pkg.table import Table\n    return Table\n"}
    _package(tmp_path, {**CLEAN, **lazy})
    tree = Tree(tmp_path, {"pkg": "pkg"}, relative_inside=frozenset({"pkg"}))
    assert [v.split(": ")[1] for v in violations(tree)["absolute imports of the own package"]] == [
        "from pkg.table import Table", "from pkg import table"]
    relative_user = CLEAN["user.py"].replace("from pkg import table", "from . import table")
    (tmp_path / "pkg" / "user.py").write_text(textwrap.dedent(relative_user))
    (tmp_path / "pkg" / "lazy.py").write_text("def load():\n    from .table import Table\n    return Table\n")
    assert violations(tree)["absolute imports of the own package"] == []


def test_a_cycle_through_a_lazy_table_is_seen(tmp_path):
    tree = _package(tmp_path, {**CLEAN, "table.py": "import pkg\nclass Table:\n    pass\n"})
    assert cycles(graph(tree)) == [["pkg", "pkg.table"]]


def test_dependencies_point_one_way():
    g = _graph()

    def layer(module: str) -> str:
        if module.startswith("worldstep.engine"):
            return "engine"
        return "envs" if module.startswith("worldstep.envs") else "sdk"

    order = {"engine": 0, "envs": 1, "sdk": 2}
    upward = [f"{a} -> {b}" for a, targets in g.items() for b in targets if order[layer(b)] > order[layer(a)]]
    assert not upward, upward
    core = [m for m in g if m.startswith(("worldstep.engine.kv", "worldstep.engine.windowing",
                                                 "worldstep.engine.scheduler"))]
    model_code = [f"{m} -> {t}" for m in core for t in g[m] if ".models" in t or ".vae" in t]
    assert not model_code, model_code


def test_no_engine_file_reaches_300_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / "engine").rglob("*.py")}
    assert max(sizes.values()) < 300, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]


def test_records_hold_no_reference_up_to_their_owner(tmp_path):
    """A session and its decoder session are records: the model and the decoder have the verbs."""
    import yaml
    from worldstep.engine.config import RolloutKnobs
    from worldstep.engine.models.cosmos3.checkpoint import build_checkpoint
    from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel

    arch = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())["model"]["architecture"]
    model = Cosmos3WorldModel.from_pretrained(build_checkpoint(tmp_path / "tiny", arch), device="cpu",
                                              height=32, width=32)
    owners = (model, model.kv, model.kv.offload, model.decoder, model.scheduler, model.runner)
    with model.session(np.zeros((32, 32, 3), np.uint8), "go", 0, knobs=RolloutKnobs(num_steps=1)) as session:
        model.step([session], [np.zeros((4, model.spec.action_dim), np.float32)])
        for record in (session, session.decoder_session):
            held = list(vars(record).values())
            assert not any(value is owner for value in held for owner in owners), type(record).__name__
            assert not any(callable(getattr(record, verb, None)) for verb in ("step", "close", "fork", "decode"))
        finalizer = session.decoder_session.slot_release  # a warm decoder session gives its slot back when collected
        assert finalizer is not None and finalizer.alive
        _, func, args, kwargs = finalizer.peek()
        reached = [getattr(func, "__self__", None), *args, *kwargs.values()]
        assert not any(value is owner for value in reached for owner in owners), finalizer


def _cache_internals_outside_kv(tree: Tree) -> list[str]:
    """``<cache>.offload`` (or a ``table`` of it) read outside engine/kv (the cache is the only API over the pool)."""
    import ast

    found = []
    for name, path in tree.modules.items():
        if name.startswith("worldstep.engine.kv"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in {"table", "offload"}:
                owner = ast.unparse(node.value)
                if owner.endswith(("kv", "cache")):
                    found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_nobody_outside_engine_kv_reads_the_cache_table_or_offload(tmp_path):
    assert not _cache_internals_outside_kv(TREE), _cache_internals_outside_kv(TREE)
    broken = _package(tmp_path, {**CLEAN, "user.py": "def pages(model):\n    return model.kv.offload.allocator\n"})
    assert _cache_internals_outside_kv(broken) == ["pkg.user:2: model.kv.offload"]


# --- the env's constructor: at most 8 arguments, the rest are wrappers ------------------------------------

MAX_ENV_ARGUMENTS = 8


def _constructor_violations(cls: type) -> list[str]:
    """What breaks the rule in ``cls.__init__``: more than MAX_ENV_ARGUMENTS arguments, or a catch-all (``*args``,
    ``**kwargs``) that would hide how many it takes."""
    import inspect

    params = [p for name, p in inspect.signature(cls.__init__).parameters.items() if name != "self"]
    found = [f"{cls.__name__}.__init__ takes {p}" for p in params if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if len(params) > MAX_ENV_ARGUMENTS:
        found.append(f"{cls.__name__}.__init__ takes {len(params)} arguments > {MAX_ENV_ARGUMENTS}: "
                     f"{[p.name for p in params]}")
    return found


def test_the_env_constructor_takes_at_most_eight_arguments():
    from worldstep.envs import WorldModelEnv

    assert not _constructor_violations(WorldModelEnv)


def test_the_argument_rule_fails_on_an_injected_ninth_and_a_catch_all():
    import inspect

    from worldstep.envs import WorldModelEnv

    params = list(inspect.signature(WorldModelEnv.__init__).parameters.values())

    def injected(cls_name: str, extra: inspect.Parameter) -> type:
        def __init__(self, *args, **kwargs):  # noqa: N807 - the signature below is what the rule reads
            raise AssertionError("never constructed")

        __init__.__signature__ = inspect.Signature([*params, extra])
        return type(cls_name, (WorldModelEnv,), {"__init__": __init__})

    ninth = injected("NinthArgument", inspect.Parameter("max_windows", inspect.Parameter.KEYWORD_ONLY, default=32))
    assert _constructor_violations(ninth) == [
        f"NinthArgument.__init__ takes 9 arguments > 8: {[p.name for p in params[1:]] + ['max_windows']}"]
    catch_all = injected("CatchAll", inspect.Parameter("options", inspect.Parameter.VAR_KEYWORD))
    assert any("**options" in v for v in _constructor_violations(catch_all))
