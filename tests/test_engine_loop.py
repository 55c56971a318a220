"""The engine loop lives in the engine, over a model adapter that allocates no cache; config is the constructor;
what enters is resolved or checked once.

Structural rules (each run once more over a tree with an injected violation, so they are shown to fail):
no module under ``engine/models/`` constructs a ``PagedKVCache`` (the loop does), and ``engine/models/cosmos3/``
keeps at most 16 modules besides ``__init__.py`` (counting ``inverse_dynamics.py``, which another branch adds).
Counting tests: an env resolves its conditioning once (not on every reset or open), a reset checks its image
and prompt once (where they enter), a window primes its attention batch once (not once more per forward), and
``worldstep.load`` resolves the device once.
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import worldstep
from tiny_world import FAST, cache_dir, world, zeros  # noqa: F401
from worldstep.engine.config import CacheConfig, RolloutKnobs, RuntimeConfig
from worldstep.engine.settings import ConfigError, UnknownKeyError

ROOT = Path(__file__).parent.parent
COSMOS3_MAX_MODULES = 16
COMING = frozenset({"inverse_dynamics.py"})  # a module another branch adds to cosmos3/: room is kept for it


# --- the adapter allocates no cache -------------------------------------------------------------------------

def cache_constructions(folder: Path) -> list[str]:
    """``file:line`` of every call of ``PagedKVCache(...)`` (by name or attribute) under ``folder``."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if name == "PagedKVCache":
                    found.append(f"{path.relative_to(folder.parent)}:{node.lineno}")
    return found


def test_no_adapter_allocates_a_cache_and_the_loop_does():
    assert cache_constructions(ROOT / "engine" / "models") == []
    assert [c.split(":")[0] for c in cache_constructions(ROOT / "engine")] == ["engine/loop.py"]


def test_the_cache_rule_fails_on_an_injected_allocation(tmp_path):
    models = tmp_path / "models"
    shutil.copytree(ROOT / "engine" / "models", models)
    (models / "cosmos3" / "window.py").write_text(
        (models / "cosmos3" / "window.py").read_text()
        + "\n\ndef own_cache(n):\n    return kv.PagedKVCache(num_layers=n)\n")
    assert [c.rsplit(":", 1)[0] for c in cache_constructions(models)] == ["models/cosmos3/window.py"]


# --- cosmos3 keeps the maths, the loader and the checkpoint layout ------------------------------------------

def module_count_problem(folder: Path, limit: int = COSMOS3_MAX_MODULES) -> str | None:
    modules = {p.name for p in folder.glob("*.py")} - {"__init__.py"} | COMING
    if len(modules) > limit:
        return f"{folder.name}/ has {len(modules)} modules besides __init__.py (with {sorted(COMING)}) > {limit}"
    return None


def test_cosmos3_has_at_most_sixteen_modules_with_the_one_to_come():
    assert module_count_problem(ROOT / "engine" / "models" / "cosmos3") is None


def test_the_module_count_rule_fails_on_injected_modules(tmp_path):
    folder = tmp_path / "cosmos3"
    shutil.copytree(ROOT / "engine" / "models" / "cosmos3", folder)
    present = len({p.name for p in folder.glob("*.py")} - {"__init__.py"} | COMING)
    for i in range(COSMOS3_MAX_MODULES - present + 1):
        (folder / f"extra_{i}.py").write_text('"""An injected module."""\n')
    assert module_count_problem(folder) == (f"cosmos3/ has {COSMOS3_MAX_MODULES + 1} modules besides __init__.py "
                                            f"(with ['inverse_dynamics.py']) > {COSMOS3_MAX_MODULES}")


def test_the_loop_imports_no_model_code():
    """The loop, the runner, the session, the graphs and the adapter's contract are generic: no import reaches
    ``engine/models/`` (only a model's own package imports the loop)."""
    for name in ("loop", "runner", "session", "graphs", "adapter", "spec", "config", "latent_windows"):
        tree = ast.parse((ROOT / "engine" / f"{name}.py").read_text())
        modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [m for m in modules if m.startswith("models") or ".models" in m], name


# --- config is the constructor ------------------------------------------------------------------------------

def test_the_yaml_sections_are_the_engine_models():
    config = worldstep.load_config("tiny")
    assert type(config.cache) is CacheConfig and type(config.rollout) is RolloutKnobs
    assert isinstance(config.model, RuntimeConfig)  # the model section adds checkpoint, device, dtype
    assert worldstep.CacheConfig is CacheConfig


def test_load_hands_the_sections_to_the_engine_as_they_are(world):  # noqa: F811
    model, config = world.model, world.config
    assert model.runtime is config.model and model.spec.height == config.model.height
    assert (model.kv.num_pages, model.kv.page_size) == (config.cache.num_pages, config.cache.page_size)


def test_flat_keywords_reach_the_sections_and_unknown_ones_are_a_type_error():
    from worldstep.engine.config import sections

    cache, runtime = sections(None, None, {"num_pages": 64, "height": 32, "cuda_graphs": False})
    assert (cache.num_pages, cache.page_size, runtime.height) == (64, CacheConfig().page_size, 32)
    with pytest.raises(UnknownKeyError, match="num_page: unknown key .*did you mean 'num_pages'") as err:
        sections(None, None, {"num_page": 64})
    assert isinstance(err.value, TypeError)
    with pytest.raises(ConfigError, match=r"cuda_graphs='yes' is invalid; allowed: True or False"):
        sections(None, None, {"cuda_graphs": "yes"})
    with pytest.raises(ConfigError, match=r"num_pages=0 is invalid; allowed: >= 1"):
        sections(CacheConfig(), RuntimeConfig(), {"num_pages": 0})


def test_load_resolves_the_device_once(cache_dir, monkeypatch):  # noqa: F811
    from worldstep.engine import devices

    calls = []
    real = devices.resolve_device
    monkeypatch.setattr(devices, "resolve_device", lambda *a, **k: calls.append(a) or real(*a, **k))
    for module in [m for name, m in sys.modules.items() if name.startswith("worldstep")]:
        if getattr(module, "resolve_device", None) is real:
            monkeypatch.setattr(module, "resolve_device", devices.resolve_device)
    world = worldstep.load("tiny", device="auto", **FAST)  # noqa: F811
    assert len(calls) == 1 and str(world.model.device) in ("cpu", "cuda:0")


# --- resolved and checked once ------------------------------------------------------------------------------

def _count(monkeypatch, name: str, *extra) -> list:
    """Count calls of the function ``name`` of ``worldstep.engine.checks`` or ``.embodiment.conditioning`` (and of
    ``extra`` ``(module, attribute)`` pairs) wherever a worldstep module imported it."""
    calls = []
    targets = {id(getattr(m, name)): getattr(m, name) for m in list(sys.modules.values())
               if getattr(m, "__name__", "").startswith("worldstep") and callable(getattr(m, name, None))}
    for module in [m for n, m in sys.modules.items() if n.startswith("worldstep")]:
        real = getattr(module, name, None)
        if real is not None and id(real) in targets:
            monkeypatch.setattr(module, name, lambda *a, _real=real, **k: calls.append(a) or _real(*a, **k))
    for module, attribute in extra:
        real = getattr(module, attribute)
        monkeypatch.setattr(module, attribute, lambda *a, _real=real, **k: calls.append(a) or _real(*a, **k))
    return calls


def test_an_env_resolves_its_conditioning_once(world, monkeypatch):  # noqa: F811
    calls = _count(monkeypatch, "resolve_conditioning")
    env = worldstep.make_env(world, embodiment="droid_lerobot", max_windows=3)
    try:
        for seed in (0, 1):
            env.reset(seed=seed)
            env.step(zeros(env.action_space))
        assert len(calls) == 1  # at construction; no reset, open or step resolves it again
    finally:
        env.close()


def test_a_reset_checks_its_image_and_prompt_once(world, monkeypatch):  # noqa: F811
    from worldstep.engine.models.cosmos3 import canvas

    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    env = worldstep.make_env(world, image=image, max_windows=3)
    try:
        images = _count(monkeypatch, "check_image", (canvas, "_check_image"))
        prompts = _count(monkeypatch, "check_prompt")
        env.reset(seed=0)  # the env's own image and prompt were checked when it was made
        assert (len(images), len(prompts)) == (0, 0)
        env.reset(seed=0, options={"image": image, "prompt": "push the block left"})
        assert [a[0] for a in images] == ["options['image']"] and [a[0] for a in prompts] == ["options['prompt']"]
    finally:
        env.close()


def test_a_window_primes_its_batch_once(world, monkeypatch):  # noqa: F811
    from worldstep.engine.models.cosmos3 import layers, window

    primes = _count(monkeypatch, "prime")
    forwards = _count(monkeypatch, "gen_layers")
    assert "prime" in vars(window) and "prime" in vars(layers)  # imported there by name: counted there
    env = worldstep.make_env(world, max_windows=3)
    try:
        env.reset(seed=0)
        del primes[:], forwards[:]
        env.step(zeros(env.action_space))
        steps = world.knobs.num_steps
        assert len(forwards) == steps + 1  # the denoise steps and the commit pass
        assert len(primes) == 1  # before the denoise loop; every forward of the window reuses it
    finally:
        env.close()


def _members(protocol: type) -> set[str]:
    """The attributes and methods a Protocol declares."""
    declared = set(getattr(protocol, "__annotations__", {}))
    return declared | {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}


def test_cosmos3_implements_the_adapter_contract(world):  # noqa: F811
    from worldstep.engine.adapter import ModelAdapter, WindowOps

    adapter, ops = world.model.adapter, world.model.runner.ctx
    assert {"spec", "kv_layout", "vae", "prefill", "bind", "denoise", "commit"} <= _members(ModelAdapter) | _members(
        WindowOps)
    assert [n for n in sorted(_members(ModelAdapter)) if not hasattr(adapter, n)] == []
    assert [n for n in sorted(_members(WindowOps)) if not hasattr(ops, n)] == []
    assert world.model.kv_bytes_per_token == adapter.kv_layout.bytes_per_token > 0
