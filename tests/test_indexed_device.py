"""The engine under an indexed device spelling (``cpu:0``), which is how CUDA-only device bugs show on a CPU.

A CUDA tensor reports ``cuda:0`` while ``torch.device("cuda")`` compares unequal to it; on a CPU, a tensor
made on ``cpu:0`` reports ``cpu``. So a model built with ``device="cpu:0"`` runs into every place that keeps
the spelling it was given instead of the canonical form (`worldstep.engine.devices`). Here it runs single and
batched steps, a fork, offload, the decode lane and the server, with latents and frames equal to the same
model built on ``cpu``; and a source rule keeps every stored device and device comparison canonical.
"""

from __future__ import annotations

import ast
import textwrap
from importlib.resources import files
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import worldstep
import yaml
from tiny_world import FAST, assert_frames_match_batched, ramp
from worldstep.engine.attention import resolve_backend
from worldstep.engine.config import RolloutKnobs
from worldstep.engine.devices import canonical_device, resolve_device
from worldstep.engine.flashinfer_kernels import FlashinferKernels
from worldstep.engine.kv import PagedKVCache
from worldstep.engine.models.cosmos3.checkpoint import build_checkpoint
from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel
from worldstep.serve.server import WorldModelServer

ROOT = Path(__file__).resolve().parents[1]
IMAGE = np.random.RandomState(0).randint(0, 256, (96, 160, 3), dtype=np.uint8)
TOKEN = "t0ken-for-indexed-device"
CPU = torch.device("cpu")

# --- the canonical form ----------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["cpu", "cpu:0", torch.device("cpu"), torch.device("cpu:0"), torch.device("cpu", 3)])
def test_every_cpu_spelling_is_the_form_cpu_tensors_report(spec):
    device = canonical_device(spec)
    assert device == torch.empty(0, device=spec).device == CPU and str(device) == "cpu"


@pytest.mark.parametrize(("spec", "want"), [("cuda", "cuda:1"), (torch.device("cuda"), "cuda:1"), ("cuda:0", "cuda:0"),
                                            (torch.device("cuda", 2), "cuda:2"), (0, "cuda:0"), (3, "cuda:3")])
def test_a_bare_cuda_is_the_current_index(monkeypatch, spec, want):
    """A CUDA machine, emulated: ``cuda`` is the current device's index, what its tensors report."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert canonical_device(spec) == torch.device(want) and canonical_device(spec).index is not None


@pytest.mark.parametrize(("spec", "match"), [
    ("gpu", r"device='gpu' is not a torch device"), ("cuda:x", r"device='cuda:x' is not a torch device"),
    (-1, r"device=-1 is invalid; allowed: 'cpu', 'cuda'"), (True, r"device=True is invalid"),
    (1.0, r"device=1.0 is invalid"), (None, r"device=None is invalid"),
])
def test_a_bad_spelling_is_refused_naming_the_argument(spec, match):
    with pytest.raises(ValueError, match=match):
        canonical_device(spec)
    with pytest.raises(ValueError, match=match.replace("device=", "kv_device=", 1)):
        canonical_device(spec, name="kv_device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_where_there_is_none_is_refused():
    with pytest.raises(ValueError, match="model.device='cuda:0': CUDA is not available"):
        canonical_device("cuda:0", name="model.device")


def test_every_entry_point_stores_the_canonical_form():
    cache = PagedKVCache(num_layers=1, num_pages=2, page_size=4, num_kv_heads=1, head_dim=8, device="cpu:0")
    assert cache.device == cache.kv.device == CPU
    assert FlashinferKernels("cpu:0").device == CPU
    assert resolve_device("cpu:0") == CPU and str(resolve_device("auto")) in ("cpu", f"cuda:{_current_cuda()}")
    assert resolve_backend("auto", "cpu:0").value == "sdpa"


def _current_cuda() -> int | None:
    return torch.cuda.current_device() if torch.cuda.is_available() else None


# --- the engine under cpu:0 ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(the model on ``cpu:0``, the same weights on ``cpu``); the ``cpu:0`` one overlaps decodes on its lane."""
    architecture = yaml.safe_load(files("worldstep.configs").joinpath("tiny.yaml").read_text())["model"]["architecture"]
    path = build_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", architecture, seed=1)
    indexed = Cosmos3WorldModel.from_pretrained(path, device="cpu:0", num_pages=64, page_size=16,
                                                overlap_decode=True, height=32, width=32)
    plain = Cosmos3WorldModel(indexed.components, device=CPU, num_pages=256, page_size=16, height=32, width=32)
    yield indexed, plain
    for model in (indexed, plain):
        model.close_all()
        assert model.kv.num_used_pages == 0 and model.decoder.live_warm_sessions == 0


def _open(model, seed: int, **knobs):
    knobs = RolloutKnobs(**{"chunk_size": 4, "num_steps": 1, **knobs})
    return model.open_session(IMAGE, "push the block", 8, knobs=knobs, generator=torch.Generator().manual_seed(seed),
                              action_width=10)


def _actions(seed: int) -> np.ndarray:
    return np.random.RandomState(seed).uniform(-1, 1, (4, 10)).astype(np.float32)


def test_the_model_keeps_every_device_canonical(models):
    indexed, _ = models
    assert indexed.device == indexed.kv.device == indexed.decoder.device == indexed.runner.ctx.device == CPU
    assert str(indexed.device) == "cpu" and indexed.overlap_decode and indexed.scheduler.split_groups


def test_single_steps_and_a_fork_under_cpu_0_equal_cpu(models):
    indexed, plain = models
    got, want = _open(indexed, 1), _open(plain, 1)
    try:
        assert np.array_equal(got.first_frame, want.first_frame)
        for w in range(2):
            a, b = indexed.step([got], [_actions(w)])[0], plain.step([want], [_actions(w)])[0]
            assert torch.equal(a.latents, b.latents) and np.array_equal(a.frames, b.frames)
        fork_a, fork_b = indexed.fork(got), plain.fork(want)
        a, b = indexed.step([fork_a], [_actions(7)])[0], plain.step([fork_b], [_actions(7)])[0]
        assert torch.equal(a.latents, b.latents) and a.window_index == 2
        indexed.close(fork_a), plain.close(fork_b)
    finally:
        indexed.close(got), plain.close(want)
    assert indexed.kv.num_used_pages == 0


def test_a_batched_step_with_the_decode_lane_under_cpu_0(models):
    """Two decoding sessions: `overlap_decode` splits them into two groups, one decoding on the lane while the
    other denoises; each matches the same session stepped alone on ``cpu``."""
    indexed, plain = models
    sessions = [_open(indexed, s) for s in (2, 3)]
    try:
        for w in range(2):
            results = indexed.step(sessions, [_actions(10 * w + i) for i in range(2)])
            assert [r.timings.shared_by for r in results] == [1, 1]  # split into groups of one
            for i, result in enumerate(results):
                alone = _replay(plain, (2, 3)[i], [_actions(10 * k + i) for k in range(w + 1)])
                assert torch.equal(result.latents, alone.latents)
                assert_frames_match_batched(result.frames, alone.frames)
    finally:
        for s in sessions:
            indexed.close(s)


def _replay(model, seed: int, actions: list[np.ndarray]):
    with model.session(IMAGE, "push the block", 8, knobs=RolloutKnobs(chunk_size=4, num_steps=1),
                       generator=torch.Generator().manual_seed(seed), action_width=10) as session:
        for chunk in actions:
            result = model.step([session], [chunk])[0]
    return result


def test_offload_and_reload_under_cpu_0_are_bit_identical(models):
    """The pool holds one session of this size (14 pages); stepping the other offloads the idle one to the host."""
    _, plain = models
    indexed = Cosmos3WorldModel(plain.components, device=torch.device("cpu:0"), num_pages=20, page_size=16,
                                cpu_offload_pages=64, height=32, width=32)
    knobs = {"decode": False}
    a, b = _open(indexed, 4, **knobs), _open(indexed, 5, **knobs)
    offloaded = False
    try:
        got = []
        for w in range(3):
            got.append(indexed.step([a], [_actions(w)])[0].latents)
            offloaded |= indexed.kv.is_offloaded(b.session_id)
            indexed.step([b], [_actions(w + 10)])
            offloaded |= indexed.kv.is_offloaded(a.session_id)
    finally:
        indexed.close(a), indexed.close(b)
    assert offloaded, "the pool was roomy enough that nothing was offloaded"
    with plain.session(IMAGE, "push the block", 8, knobs=RolloutKnobs(chunk_size=4, num_steps=1, decode=False),
                       generator=torch.Generator().manual_seed(4), action_width=10) as alone:
        want = [plain.step([alone], [_actions(w)])[0].latents for w in range(3)]
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    assert indexed.kv.num_used_pages == 0 and indexed.kv.num_free_cpu_pages == 64


# --- the sdk and the server under cpu:0 ------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORLDSTEP_CACHE", str(tmp_path_factory.mktemp("worldstep_cache")))
        yield worldstep.load("tiny", device="cpu:0", **FAST)


def test_the_sdk_loads_one_model_for_every_spelling(world):
    assert world.model.device == CPU and world.config.model.device == "cpu:0"
    a = worldstep.load(world.config, share=True)
    b = worldstep.load(world.config.with_overrides(device="cpu"), share=True)
    assert a.model is b.model  # "cpu:0" and "cpu" are one device, so one shared model


def test_the_server_serves_a_cpu_0_world_like_the_local_env(world):
    server = WorldModelServer(world, token=TOKEN).start()
    try:
        remote = gym.make("worldstep/Remote-v0", url=server.url, token=TOKEN, max_windows=2)
        local = worldstep.make_env(world, max_windows=2)
        (a, _), (b, _) = remote.reset(seed=5), local.reset(seed=5)
        assert np.array_equal(a["frames"], b["frames"])
        chunk = ramp(local.action_space)
        assert np.array_equal(remote.step(chunk)[0]["frames"], local.step(chunk)[0]["frames"])
        remote.close(), local.close()
    finally:
        server.drain()
    assert server.open_sessions() == 0 and server.pages_in_use() == 0


# --- the source rule: every stored device and device comparison is canonical ------------------------

# what holds or compares the engine's devices: the engine, and the sdk parts that hand devices to it
SCANNED = ("engine", "sdk/bench", "sdk/serve", "sdk/world.py", "sdk/memory.py", "tests/gpu")
CANONICAL = {"canonical_device", "resolve_device"}  # calls whose result is canonical


def device_rule_breaks(source: str, where: str) -> list[str]:
    """``torch.device(...)`` outside a ``with`` (where it only sets where modules are built), an attribute
    ``.device`` assigned anything but a canonical call or a tensor's ``.device``, and a comparison of a
    ``.device`` with anything else."""
    tree, breaks = ast.parse(source), []
    with_items = {id(item.context_expr) for node in ast.walk(tree) if isinstance(node, ast.With) for item in node.items}
    for node in ast.walk(tree):
        if _is_torch_device(node) and id(node) not in with_items:
            breaks.append(f"{where}:{node.lineno}: torch.device(...) stores a spelling; use canonical_device")
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) and node.value is not None else []
        if any(isinstance(t, ast.Attribute) and t.attr == "device" for t in targets) and not _canonical(node.value):
            breaks.append(f"{where}:{node.lineno}: a stored .device that is not canonical_device(...) or a "
                          "tensor's .device")
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
            sides = [s for s in [node.left, *node.comparators] if not _is_auto(s)]  # "auto": a config's, no device
            if any(_is_device_attr(s) for s in sides) and not all(_canonical(s) for s in sides):
                breaks.append(f"{where}:{node.lineno}: a .device compared with a value that may not be canonical")
    return breaks


def _is_torch_device(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "device"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch")


def _is_auto(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == "auto"


def _is_device_attr(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "device"


def _canonical(node: ast.AST) -> bool:
    if _is_device_attr(node):
        return True
    if isinstance(node, ast.Call):
        func = node.func
        return (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) in CANONICAL
    return False


def _scanned_files() -> list[Path]:
    paths = []
    for name in SCANNED:
        path = ROOT / name
        paths += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return [p for p in paths if p != ROOT / "engine" / "devices.py"]


def test_every_stored_device_and_comparison_is_canonical():
    files_ = _scanned_files()
    assert len(files_) > 40 and ROOT / "engine" / "kv" / "cache.py" in files_
    breaks = [b for p in files_ for b in device_rule_breaks(p.read_text(), str(p.relative_to(ROOT)))]
    assert not breaks, "\n".join(breaks)


@pytest.mark.parametrize("source", [
    "self.device = torch.device(device)",  # the first GPU run's bug: the spelling as given
    "self.device = device",
    "kernels.device: torch.device = spec",
    "ok = t.device != torch.device('cuda')",
    "ok = cache.device == 'cuda'",  # a torch.device never equals a str: always False
    "ok = args.device != 'cpu'",
    "device = torch.device('cuda')",
])
def test_the_device_rule_fails_on_an_injected_violation(source):
    assert device_rule_breaks(textwrap.dedent(source), "injected.py")


@pytest.mark.parametrize("source", [
    "self.device = canonical_device(device)", "self.device: torch.device = weight.device",
    "ok = t.device != cache.device", "auto = m.device == 'auto'", "with torch.device('meta'):\n    pass",
    "kind = device.type == 'cuda'",
])
def test_the_device_rule_passes_the_canonical_forms(source):
    assert not device_rule_breaks(source, "clean.py")
