"""The GPU-regime engine, checked for equality on a CPU (its timing is the GPU check's: tests/gpu/).

- flashinfer: wrappers and workspace made once per model, one plan per page layout (not per step or layer), host
  index tensors for the plan; results equal the sdpa backend (flashinfer emulated by tests/flashinfer_emulation).
- Overlap: a step split in halves (one half's decode queued on the decode lane while the other denoises) gives the
  frames of the unsplit step, within the batched-step bound (docs/exactness.md).
- No host wait inside the denoise loop: timesteps come from a host list; the latents' finiteness is checked once,
  when the frames are fetched; NaN latents close the step's sessions and return everything.
"""

from __future__ import annotations

from contextlib import contextmanager
from importlib.resources import files

import flashinfer_emulation
import numpy as np
import pytest
import torch
import yaml
from host_sync import HostSyncError, refuse_host_syncs
from tiny_world import BATCHED_LATENTS_ATOL, assert_frames_match_batched
from worldstep.engine.config import RolloutKnobs
from worldstep.engine.models.cosmos3.checkpoint import build_checkpoint
from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel
from worldstep.engine.scheduler import Scheduler

IMAGE = np.random.RandomState(0).randint(0, 256, (64, 64, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    arch = yaml.safe_load(files("worldstep.configs").joinpath("tiny.yaml").read_text())["model"]["architecture"]
    return build_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", arch, seed=2)


def _rollout(model, windows: int, sessions: int = 2, decode: bool = True, close: bool = True, **knobs):
    knobs = RolloutKnobs(**{"num_steps": 3, "context_frames": 2, "decode": decode, **knobs})
    opened = [model.open_session(IMAGE, "push", 1, knobs=knobs, generator=torch.Generator().manual_seed(i),
                                 action_width=5) for i in range(sessions)]
    rng = np.random.RandomState(3)
    out = []
    for _ in range(windows):
        out.append(model.step(opened, [rng.uniform(-1, 1, (4, 5)).astype(np.float32) for _ in opened]))
    for s in opened if close else ():
        model.close(s)
    return out


def test_flashinfer_path_equals_sdpa_with_one_plan_per_layout_and_wrappers_made_once(checkpoint, monkeypatch):
    sdpa = _rollout(Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=32, width=32,
                                                      attention_backend="sdpa"), windows=4, decode=False)
    flashinfer_emulation.install(monkeypatch)
    model = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=32, width=32,
                                              attention_backend="flashinfer")
    emulated = _rollout(model, windows=4, decode=False)
    for a, b in zip(sdpa, emulated):
        for x, y in zip(a, b):
            torch.testing.assert_close(y.latents, x.latents, atol=1e-5, rtol=0)
    counts = flashinfer_emulation.COUNTS
    assert counts["wrappers"] == 2  # one ragged + one paged wrapper for the model's whole life
    # one plan per window: every denoise step, every layer and the commit pass share it (the commit's own
    # append comes after its attention); the next window's pages differ, so it plans again
    assert model.runner.ctx.kernels.plans == 4 and counts["plans"] == 4 * 2  # ragged + paged
    layers = model.transformer.config.num_hidden_layers
    assert counts["runs"] >= 4 * (3 + 1) * layers  # every step of every layer ran on a reused plan
    assert model.kv.num_used_pages == 0


def test_rows_without_context_are_planned_apart(checkpoint, monkeypatch):
    """A fresh session beside a committed one: the paged kernel runs only on the rows that have context."""
    flashinfer_emulation.install(monkeypatch)
    model = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=32, width=32,
                                              attention_backend="flashinfer")
    reference = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=32, width=32,
                                                  attention_backend="sdpa")
    for m in (model, reference):
        m.test_out = _rollout(m, windows=2, sessions=3, decode=False, guidance_scale=2.0)
    for a, b in zip(reference.test_out, model.test_out):
        for x, y in zip(a, b):
            torch.testing.assert_close(y.latents, x.latents, atol=1e-5, rtol=0)


def test_a_step_in_halves_gives_the_frames_of_the_whole_step(checkpoint):
    whole = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=32, width=32, overlap_decode=False)
    halves = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=32, width=32, overlap_decode=True)
    assert halves.runner.lane.stream is None  # on a CPU the decode lane is the calling thread
    a, b = _rollout(whole, windows=3, sessions=4), _rollout(halves, windows=3, sessions=4)
    for step_a, step_b in zip(a, b):
        for x, y in zip(step_a, step_b):
            assert (x.latents - y.latents).abs().max() <= BATCHED_LATENTS_ATOL
            assert_frames_match_batched(y.frames, x.frames)
            assert y.timings.denoise_s > 0 and y.timings.decode_s > 0
    for m in (whole, halves):
        assert m.kv.num_used_pages == 0 and m.decoder.live_warm_sessions == 0


def test_parts_split_groups_in_halves_only_when_overlapping(checkpoint):
    model = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=32, width=32)
    knobs = RolloutKnobs(num_steps=1, decode=False)
    sessions = [model.open_session(IMAGE, "go", 0, knobs=knobs) for _ in range(5)]
    other = model.open_session(IMAGE, "go", 0, knobs=RolloutKnobs(num_steps=2, decode=False))
    everyone = [*sessions, other]
    actions = [np.zeros((4, model.spec.action_dim), np.float32)] * len(everyone)

    def parts_of(split: bool, decodes: list[bool] | None = None) -> list[list[int]]:
        decodes = [True] * len(everyone) if decodes is None else decodes
        batch = Scheduler(model.kv, split_groups=split).schedule(everyone, actions, decodes)
        return [[w.index for w in group] for group in batch.groups]

    assert parts_of(split=False) == [[0, 1, 2, 3, 4], [5]]
    assert parts_of(split=True) == [[0, 1], [2, 3, 4], [5]]  # a lone session is not split
    assert parts_of(split=True, decodes=[False] * len(everyone)) == [[0, 1, 2, 3, 4], [5]]  # nothing to overlap
    assert parts_of(split=True, decodes=[s is not sessions[0] for s in everyone]) == [[0, 1, 2, 3, 4], [5]]
    model.close_all()


@pytest.mark.parametrize("decoding_sessions,step_decodes,groups", [(False, True, 1), (True, False, 1), (True, True, 2)])
def test_overlap_splits_a_group_of_8_only_when_it_decodes(checkpoint, monkeypatch, decoding_sessions, step_decodes,
                                                          groups):
    """With overlap on (CUDA's default), 8 sessions that are not decoded run as ONE window: one forward of 8 per
    denoise step; only a decoding step splits them (two forwards of 4, one half's decode overlapping the other)."""
    from worldstep.engine import runner as stepping

    model = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=32, width=32, overlap_decode=True)
    knobs = RolloutKnobs(num_steps=1, decode=decoding_sessions)
    sessions = [model.open_session(IMAGE, "go", 0, knobs=knobs) for _ in range(8)]
    sizes = []
    real = stepping.denoise_window
    monkeypatch.setattr(stepping, "denoise_window", lambda ctx, group: sizes.append(len(group)) or real(ctx, group))
    model.step(sessions, [np.zeros((4, model.spec.action_dim), np.float32)] * 8, decode=step_decodes)
    assert sizes == ([8] if groups == 1 else [4, 4])
    model.close_all()


def test_nan_latents_are_caught_when_frames_are_fetched_and_everything_comes_back(checkpoint, monkeypatch):
    from worldstep.engine import runner as stepping

    model = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=32, width=32)
    sessions = [model.open_session(IMAGE, "go", 0, knobs=RolloutKnobs(num_steps=1)) for _ in range(2)]
    real = stepping.denoise_window

    def nan_window(*args):
        window = real(*args)
        for job in window.jobs:
            job.latents = job.latents * float("nan")
        return window

    monkeypatch.setattr(stepping, "denoise_window", nan_window)
    with pytest.raises(FloatingPointError, match="NaN"):
        model.step(sessions, [np.zeros((4, model.spec.action_dim), np.float32)] * 2)
    assert all(s.closed for s in sessions)
    assert model.kv.num_used_pages == 0 and model.decoder.live_warm_sessions == 0 and model.live_sessions == 0


def _guarded_step(model, monkeypatch, knobs: RolloutKnobs, sessions: int = 2) -> list[list[str]]:
    """One step with the host-read guard around every window's denoise loop (and nowhere else)."""
    from worldstep.engine.models.cosmos3 import window

    entered: list[list[str]] = []

    @contextmanager
    def guard():
        with refuse_host_syncs() as refused:
            entered.append(refused)
            yield

    opened = [model.open_session(IMAGE, "go", 0, knobs=knobs) for _ in range(sessions)]
    monkeypatch.setattr(window, "denoise_loop_guard", guard)
    try:
        model.step(opened, [np.zeros((4, model.spec.action_dim), np.float32)] * sessions)
    finally:
        monkeypatch.undo()
        model.close_all()
    return entered


@pytest.mark.parametrize("knobs", [dict(num_steps=4), dict(num_steps=3, guidance_scale=2.0, window_mode="chained")])
def test_the_denoise_loop_never_reads_a_tensor_on_the_host(checkpoint, monkeypatch, knobs):
    """No `.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `bool()`, `.to("cpu")` while a window denoises (each is a
    host wait on a GPU): the scheduler's coefficients are host floats computed before the loop."""
    model = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=32, width=32)
    entered = _guarded_step(model, monkeypatch, RolloutKnobs(**knobs))
    entered += _guarded_step(model, monkeypatch, RolloutKnobs(**knobs))  # a window with committed context
    assert len(entered) == 2 and entered == [[], []]


def test_the_host_read_guard_catches_an_injected_item(checkpoint, monkeypatch):
    """The guard is live inside the loop: one `.item()` added to the UniPC step fails the window."""
    from worldstep.engine.models.cosmos3 import unipc

    real = unipc.UniPCStepper.step
    monkeypatch.setattr(unipc.UniPCStepper, "step", lambda self, v, x: (v.abs().max().item(), real(self, v, x))[1])
    model = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=32, width=32)
    with pytest.raises(HostSyncError, match=r"Tensor.item inside a loop"):
        _guarded_step(model, monkeypatch, RolloutKnobs(num_steps=2, decode=False), sessions=1)
    assert model.kv.num_used_pages == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_window_denoises_without_a_host_sync_on_cuda(checkpoint, monkeypatch):
    """On a GPU: the denoise loop of a fresh window and of one with context runs under
    `torch.cuda.set_sync_debug_mode("error")` (any host wait raises). sdpa: the tiny model's head_dim (8) is
    not one flashinfer's kernels take."""
    from worldstep.engine.models.cosmos3 import window

    @contextmanager
    def no_sync():
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(0)

    model = Cosmos3WorldModel.from_pretrained(checkpoint, device="cuda", dtype=torch.bfloat16, height=32, width=32,
                                              attention_backend="sdpa")
    sessions = [model.open_session(IMAGE, "go", 0, knobs=RolloutKnobs(num_steps=4)) for _ in range(2)]
    monkeypatch.setattr(window, "denoise_loop_guard", no_sync)
    for _ in range(2):
        results = model.step(sessions, [np.zeros((4, model.spec.action_dim), np.float32)] * 2)
        assert all(np.isfinite(r.latents.numpy()).all() for r in results)
    model.close_all()
    assert model.kv.num_used_pages == 0


def test_cuda_graphs_are_refused_where_they_cannot_run(checkpoint):
    with pytest.raises(ValueError, match="cuda_graphs=True is invalid on device='cpu'; allowed: a CUDA device"):
        Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", cuda_graphs=True)
    with pytest.raises(ValueError, match="cuda_graphs='yes' is invalid"):
        Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", cuda_graphs="yes")
    import worldstep

    with pytest.raises(worldstep.ConfigError, match="model.cuda_graphs = 'true': must be a boolean"):
        worldstep.load_config("tiny").with_overrides(cuda_graphs="true")


def _emulated_graphs(model, monkeypatch):
    """CUDA-graph capture emulated on a CPU: "replay" recomputes from the graph's static buffers only (its own
    hidden input, rotary tables, gathered context and key masks), so a window bound wrongly gives other latents
    than eager. Returns the model's `GraphCache`."""
    from dataclasses import replace
    from unittest import mock

    from worldstep.engine import graphs

    def capture(steps, collect_kv):
        out = steps.forward(collect_kv)

        def replay():
            again = steps.forward(collect_kv)
            for mine, fresh in ((out.hidden, again.hidden), (out.keys, again.keys), (out.values, again.values)):
                if mine is not None:
                    mine.copy_(fresh)

        return mock.Mock(replay=replay, pool=lambda: None), out

    monkeypatch.setattr(graphs.GraphedSteps, "_capture", capture)
    cache = graphs.GraphCache()
    object.__setattr__(model.runner, "ctx", replace(model.runner.ctx, graphs=cache))
    return cache


def graph_replays(steps: list, num_steps: int) -> int:
    """Replays a rollout's denoise steps take: one per denoise step of every GROUP a model step ran (each group is
    its own forward), counted from the results' `shared_by` (a group of k gives k results, each shared by k)."""
    return sum(round(sum(1 / r.timings.shared_by for r in results)) for results in steps) * num_steps


GRAPH_LATENTS_ATOL = 1e-6
"""Graph replay vs eager (docs/exactness.md): padded keys get exactly zero weight, but the graph's sdpa call has a
mask, a longer key row and a KV head's query heads folded into its query length, so its sums run in another order
(measured max 2.4e-7 over 12 windows, 3.0e-7 with CFG, under every kernel selection of tests/test_cpu_kernels.py)."""


@pytest.mark.exactness
def test_graphs_are_captured_once_per_geometry_and_batch_and_replayed_after(checkpoint, monkeypatch):
    """Capture mocked, 20 windows of 2 sessions at a page size (3) that does not divide a window's 5 tokens: the
    committed length shifts within a page from window to window, yet every window after the first (whose frame 0
    makes it longer) replays ONE pair of graphs (denoise step, commit), its context padded to the retention bound
    and masked: at most 2 captures in the rollout; the latents and the committed K/V equal eager, and close_all
    frees the graphs."""
    from worldstep.engine import graphs

    kwargs = dict(device="cpu", height=32, width=32, page_size=3)
    eager_model = Cosmos3WorldModel.from_pretrained(checkpoint, **kwargs)
    eager = _rollout(eager_model, windows=20, decode=False, close=False)
    model = Cosmos3WorldModel.from_pretrained(checkpoint, **kwargs)
    cache = _emulated_graphs(model, monkeypatch)
    keys = []
    real_key = graphs.graph_key
    monkeypatch.setattr(graphs, "graph_key", lambda *a: keys.append(real_key(*a)) or keys[-1])
    replayed = _rollout(model, windows=20, decode=False, close=False)
    for a, b in zip(eager, replayed):
        for x, y in zip(a, b):
            torch.testing.assert_close(y.latents, x.latents, atol=GRAPH_LATENTS_ATOL, rtol=0)
    committed = [step[0].kv.seq_len for step in replayed]
    assert len(set(committed[3:])) > 1  # full context, yet the committed length moves within a page
    assert len(keys) == 20 and len(set(keys[1:])) == 1
    assert cache.captures == len(cache) == 2  # the first window's geometry, then one for every later window
    assert sum(g.replays for g in cache._graphs.values()) == 20 * 3  # every denoise step of every window
    assert sum(g.commits for g in cache._graphs.values()) == 20  # every window's commit pass
    for a, b in zip(_committed_kv(eager_model), _committed_kv(model), strict=True):  # what the commits appended
        torch.testing.assert_close(b, a, atol=GRAPH_LATENTS_ATOL, rtol=0)
    assert len(cache) == 0  # close_all freed the graphs


def _committed_kv(model) -> list[torch.Tensor]:
    """Every open stream's committed K and V (then closes the model's sessions)."""
    out = []
    for key in model.kv.stream_keys():  # in the order they were made
        table = model.kv.page_table(key)
        for layer in range(model.kv.num_layers):
            out.extend(model.kv.gather_table(table, layer))
    model.close_all()
    return out


def test_new_weights_drop_the_graphs_and_capture_anew(checkpoint, monkeypatch):
    """A captured graph reads the fused weights of its capture: an in-place weight update (a fine-tune step, a
    loaded state dict) makes the next window capture again instead of replaying stale weights."""
    model = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=32, width=32)
    cache = _emulated_graphs(model, monkeypatch)
    _rollout(model, windows=3, decode=False)
    assert cache.captures == 2
    with torch.no_grad():
        model.transformer.layers[0].self_attn.add_q_proj.weight.mul_(0.5)
    _rollout(model, windows=1, decode=False)
    assert cache.captures == 3 and len(cache) == 1


def test_a_graph_refuses_a_context_longer_than_its_room(checkpoint):
    """A row's static buffers hold its padded length: binding a table that outgrew it is refused, not truncated."""
    from worldstep.engine.graphs import PaddedContext
    from worldstep.engine.kv import PagedKVCache, StreamKey, StreamLabel

    cache = PagedKVCache(num_layers=1, num_pages=8, page_size=4, num_kv_heads=1, head_dim=4, dtype=torch.float32)
    key = StreamKey("s", StreamLabel.MAIN)
    cache.create_stream(key)
    context = PaddedContext(cache, q_lens=[2], padded=[8])
    cache.append(key, torch.ones(1, 8, 1, 4), torch.ones(1, 8, 1, 4))
    context.fill([cache.page_table(key)])  # 8 committed + 2 fresh: exactly its room
    cache.append(key, torch.ones(1, 1, 1, 4), torch.ones(1, 1, 1, 4))
    with pytest.raises(ValueError, match="row 0 holds 9 committed tokens; this graph has room for 8"):
        context.fill([cache.page_table(key)])


def test_graph_replays_count_per_group_when_decodes_overlap(checkpoint, monkeypatch):
    """CUDA's default regime on a CPU (capture mocked, `overlap_decode` on): two decoding sessions run as two
    groups of one, each its own forward, so 12 windows of 6 steps replay 12 x 2 x 6 = 144 times, not 12 x 6 (what
    `test_cuda_graph_replay_equals_eager_steps` once asserted); both groups share the two captured geometries."""
    kwargs = dict(device="cpu", height=32, width=32, page_size=3, overlap_decode=True)
    model = Cosmos3WorldModel.from_pretrained(checkpoint, **kwargs)
    cache = _emulated_graphs(model, monkeypatch)
    steps = _rollout(model, windows=12, num_steps=6)
    assert all([r.timings.shared_by for r in results] == [1, 1] for results in steps)  # split: two groups
    assert cache.captures == 2
    assert sum(g.replays for g in cache._graphs.values()) == graph_replays(steps, 6) == 144
    model.close_all()
    assert len(cache) == 0


def test_graph_key_is_the_rows_fresh_tokens_and_padded_context(checkpoint):
    """A row's padded length is its retention bound in whole pages (never less than it holds); without a policy,
    its pages now. The key is per row (fresh tokens, padded length): the committed length itself is not in it."""
    from worldstep.engine.graphs import graph_key, padded_length
    from worldstep.engine.kv import StreamKey, StreamLabel
    from worldstep.engine.windowing import RetentionPolicy

    model = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=32, width=32, page_size=4)
    for name, n in (("a", 3), ("b", 6), ("c", 30)):
        model.kv.create_stream(StreamKey(name, StreamLabel.MAIN))
        k = torch.zeros(model.kv.num_layers, n, model.kv.num_kv_heads, model.kv.head_dim)
        model.kv.append(StreamKey(name, StreamLabel.MAIN), k, k)
    a, b, c = (model.kv.page_table(StreamKey(n, StreamLabel.MAIN)) for n in "abc")
    policy = RetentionPolicy(protected_tokens=3, context_tokens=10)  # 1 protected page + 3 of horizon + 1
    assert padded_length(a, 4, policy) == padded_length(b, 4, policy) == 5 * 4
    assert padded_length(c, 4, policy) == 32  # holds more than the policy allows: room for all of it
    assert (padded_length(a, 4, None), padded_length(b, 4, None)) == (4, 8)
    assert graph_key([4, 4], [20, 20], 32) == ((4, 4), (20, 20), 32)
    assert graph_key([4, 6], [20, 20], 32) != graph_key([4, 4], [20, 20], 32) != graph_key([4], [20], 32)


def test_padded_context_masks_exactly_the_padding(checkpoint):
    """Masked attention over a row padded with junk keys equals sdpa over the row's own keys; unmasked, it does not."""
    from worldstep.engine.graphs import masked_gqa_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(5, 4, 16, generator=g), torch.randn(9, 2, 16, generator=g), torch.randn(9, 2, 16, generator=g)
    junk = torch.randn(7, 2, 16, generator=g)
    mask = torch.tensor([True] * 9 + [False] * 7)
    padded_k, padded_v = torch.cat([k, junk]), torch.cat([v, junk])
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), enable_gqa=True).transpose(0, 1)  # [5, 4, 16]
    torch.testing.assert_close(masked_gqa_attention(q, padded_k, padded_v, mask), want, atol=1e-6, rtol=0)
    assert not torch.allclose(masked_gqa_attention(q, padded_k, padded_v, torch.ones_like(mask)), want, atol=1e-3)


@pytest.mark.gpu
def test_cuda_graph_replay_equals_eager_steps(checkpoint):
    """On a GPU: denoise steps and commits replayed from graphs captured once per window geometry give the eager
    latents; at a page size that does not divide a window's tokens, every window after the first replays one pair."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    kwargs = dict(device="cuda", dtype=torch.bfloat16, height=32, width=32, attention_backend="sdpa", page_size=3)
    eager = _rollout(Cosmos3WorldModel.from_pretrained(checkpoint, **kwargs), windows=12, num_steps=6)
    model = Cosmos3WorldModel.from_pretrained(checkpoint, cuda_graphs=True, **kwargs)
    graphed = _rollout(model, windows=12, num_steps=6)
    for a, b in zip(eager, graphed):
        for x, y in zip(a, b):
            torch.testing.assert_close(y.latents, x.latents, atol=1e-2, rtol=0)  # bf16: masked vs unmasked kernels
    graphs = model.runner.ctx.graphs
    # per group: CUDA overlaps decodes, so the two decoding sessions are two groups (12 x 2 x 6 = 144 replays)
    assert graphs.captures == 2 and sum(g.replays for g in graphs._graphs.values()) == graph_replays(graphed, 6)
    assert sum(g.commits for g in graphs._graphs.values()) == graph_replays(graphed, 6) // 6  # a commit per group
    model.close_all()
    assert len(graphs) == 0


@pytest.mark.parametrize("after_denoise", [True, False])
def test_the_decode_is_queued_after_the_denoise_or_the_commit_with_the_same_frames(checkpoint, monkeypatch,
                                                                                   after_denoise):
    """`decode_after_denoise` (the default) queues a window's decode before its commit, so on CUDA the commit runs
    beside it on the other lane; off, the old order. Either way the frames, latents and committed K/V are the
    same bits (the two touch disjoint tensors), and the phases are timed apart: the commit from its own start."""
    from worldstep.engine import runner as stepping

    model = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=32, width=32,
                                              decode_after_denoise=after_denoise)
    order = []
    real_commit, real_decode = stepping.commit_window, model.decoder.decode_checked
    monkeypatch.setattr(stepping, "commit_window", lambda *a: order.append("commit") or real_commit(*a))
    monkeypatch.setattr(model.decoder, "decode_checked", lambda *a, **k: order.append("decode") or real_decode(*a, **k))
    steps = _rollout(model, windows=3, close=False)
    stepped = order[order.index("commit") - (1 if after_denoise else 0):]  # the sessions' frame 0 decoded first
    assert stepped == (["decode", "commit"] if after_denoise else ["commit", "decode"]) * 3
    reference = _rollout(Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=32, width=32,
                                                           decode_after_denoise=not after_denoise), windows=3)
    for a, b in zip(steps, reference):
        for x, y in zip(a, b):
            assert np.array_equal(x.frames, y.frames) and torch.equal(x.latents, y.latents)
            assert x.timings.commit_s > 0 and x.timings.decode_s > 0
    with pytest.raises(ValueError, match="decode_after_denoise='yes' is invalid; allowed: True or False"):
        Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", decode_after_denoise="yes")
