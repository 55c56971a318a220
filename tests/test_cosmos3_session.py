"""The Cosmos3 session API: validation before work, determinism, batching, forks, modes, resources."""

from __future__ import annotations

import time
from importlib.resources import files

import numpy as np
import pytest
import torch
import yaml
from tiny_world import BATCHED_LATENTS_ATOL, assert_frames_match_batched
from worldstep.engine.config import RolloutKnobs
from worldstep.engine.kv import KVPoolExhausted
from worldstep.engine.models.cosmos3.checkpoint import build_checkpoint, ensure_embedded_checkpoint
from worldstep.engine.models.cosmos3.loader import CheckpointNotFoundError
from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel
from worldstep.engine.vae import DecoderOptions


@pytest.fixture(scope="module")
def architecture():
    return yaml.safe_load(files("worldstep.configs").joinpath("tiny.yaml").read_text())["model"]["architecture"]


@pytest.fixture(scope="module")
def model(tmp_path_factory, architecture):
    path = build_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", architecture, seed=1)
    return Cosmos3WorldModel.from_pretrained(path, device="cpu", num_pages=256, page_size=16)


IMAGE = np.random.RandomState(0).randint(0, 256, (96, 160, 3), dtype=np.uint8)


def _open(model, seed=0, **knobs):
    knobs = RolloutKnobs(**{"chunk_size": 4, "num_steps": 2, **knobs})
    return model.open_session(IMAGE, "push the block", 8, knobs=knobs, generator=torch.Generator().manual_seed(seed),
                              action_width=10)


def _session(model, seed=0, **knobs):
    """`_open` as a context manager: closed on any exit."""
    knobs = RolloutKnobs(**{"chunk_size": 4, "num_steps": 2, **knobs})
    return model.session(IMAGE, "push the block", 8, knobs=knobs, generator=torch.Generator().manual_seed(seed),
                         action_width=10)


def _actions(seed, chunk=4, width=10):
    return np.random.RandomState(seed).uniform(-1, 1, (chunk, width)).astype(np.float32)


def test_window_shapes_and_frames(model):
    with _session(model, context_frames=2) as session:
        assert session.first_frame.shape == (128, 128, 3) and session.first_frame.dtype == np.uint8
        result = model.step([session], [_actions(0)])[0]
        assert result.latents.shape == (4, 1, 8, 8)
        assert result.frames.shape == (4, 128, 128, 3) and result.frames.dtype == np.uint8
        assert (result.frame_start, result.frame_end, result.window_index) == (1, 5, 0)
        assert result.kv.protected_tokens > 0 and result.kv.pages_in_use > 0
        assert result.timings.denoise_s > 0 and result.timings.decode_s > 0


def test_same_seed_same_latents_bit_identical(model):
    runs = []
    for _ in range(2):
        with _session(model, seed=3) as session:
            runs.append([model.step([session], [_actions(i)])[0] for i in range(2)])
    for a, b in zip(*runs):
        assert torch.equal(a.latents, b.latents)
        assert np.array_equal(a.frames, b.frames)


@pytest.mark.exactness
@pytest.mark.parametrize("guidance", [1.0, 2.5])
def test_batched_step_matches_one_by_one(model, guidance):
    """Batched rows pack their tokens into one GEMM per linear layer: latents within BATCHED_LATENTS_ATOL."""
    singles = []
    for seed in (1, 2, 3):
        with _session(model, seed=seed, guidance_scale=guidance, negative_prompt="bad", decode=False) as session:
            singles.append([model.step([session], [_actions(seed + w)])[0].latents for w in range(2)])
    sessions = [_open(model, seed=seed, guidance_scale=guidance, negative_prompt="bad", decode=False)
                for seed in (1, 2, 3)]
    for w in range(2):
        results = model.step(sessions, [_actions(seed + w) for seed in (1, 2, 3)])
        for i, result in enumerate(results):
            assert (result.latents - singles[i][w]).abs().max() <= BATCHED_LATENTS_ATOL
    for session in sessions:
        model.close(session)
    assert model.kv.num_used_pages == 0


@pytest.mark.exactness
def test_a_batched_step_with_stacked_decode_matches_one_by_one_within_the_bound(model):
    """`decoder.batch_sessions`: the group's sessions decode in one set of calls; frames within the batched bound of
    each session stepped alone on the per-session path, and every page and warm cache comes back on close."""
    stacked = Cosmos3WorldModel(model.components, device=model.device, num_pages=256, page_size=16,
                                decoder=DecoderOptions(batch_sessions=True))
    singles = []
    for seed in (1, 2, 3):
        with _session(model, seed=seed) as session:
            singles.append([model.step([session], [_actions(seed + w)])[0] for w in range(2)])
    sessions = [_open(stacked, seed=seed) for seed in (1, 2, 3)]
    for w in range(2):
        results = stacked.step(sessions, [_actions(seed + w) for seed in (1, 2, 3)])
        for i, result in enumerate(results):
            assert (result.latents - singles[i][w].latents).abs().max() <= BATCHED_LATENTS_ATOL
            assert_frames_match_batched(result.frames, singles[i][w].frames)
    assert stacked.decoder.live_warm_sessions == 3
    stacked.close_all()
    assert stacked.kv.num_used_pages == 0 and stacked.decoder.live_warm_sessions == 0


def test_the_phases_of_a_batched_step_add_up_to_its_wall_time(model):
    """`PhaseTimings` is each window's share of its group's call: the shares of one step add up to the step's wall
    time (a consistency check, not a speed assertion), over two groups (steps 2 and 1) of 3 and 1 sessions."""
    sessions = [_open(model, seed=s) for s in (1, 2, 3)] + [_open(model, seed=4, num_steps=1)]
    try:
        for w in range(2):
            start = time.perf_counter()
            results = model.step(sessions, [_actions(10 * w + i) for i in range(4)])
            wall = time.perf_counter() - start
            phases = sum(r.timings.total_s for r in results)
            assert abs(phases - wall) <= 0.05 * wall, (phases, wall)
            assert [r.timings.shared_by for r in results] == [3, 3, 3, 1]
            group = results[0].timings.of_group()  # the group's call: its sessions' shares summed
            assert group.decode_s == pytest.approx(sum(r.timings.decode_s for r in results[:3]))
            assert all(r.timings.denoise_s > 0 and r.timings.decode_s > 0 and r.timings.other_s > 0 for r in results)
    finally:
        for s in sessions:
            model.close(s)


def test_fork_shares_pages_and_diverges_independently(model):
    session = _open(model, context_frames=0)
    model.step([session], [_actions(0)])[0]
    used_before = model.kv.num_used_pages
    fork = model.fork(session, generator=torch.Generator().manual_seed(99))
    assert model.kv.num_used_pages == used_before  # committed pages shared, not copied
    same = model.fork(session)
    a, b = model.step([session], [_actions(1)])[0], model.step([fork], [_actions(2)])[0]
    c = model.step([same], [_actions(1)])[0]
    assert torch.equal(a.latents, c.latents)  # same RNG state and actions: same window
    assert not torch.equal(a.latents, b.latents)
    model.close(fork)
    again = model.step([session], [_actions(3)])[0]  # the parent is untouched by the fork's close
    assert again.window_index == 2
    model.close(session), model.close(same)
    assert model.kv.num_used_pages == 0 and model.decoder.live_warm_sessions == 0


def test_chained_mode_runs_and_differs_from_kv(model):
    with _session(model, window_mode="chained") as chained, _session(model) as kv:
        # window 0 is shared
        assert torch.equal(model.step([chained], [_actions(0)])[0].latents, model.step([kv], [_actions(0)])[0].latents)
        x, y = model.step([chained], [_actions(1)])[0], model.step([kv], [_actions(1)])[0]
        assert x.frames.shape == y.frames.shape
        assert not torch.equal(x.latents, y.latents)
        assert model.kv_stats(chained).seq_len == chained.text_lens["main"]  # chained never commits windows


def test_open_ended_rollout_keeps_pages_flat(model):
    with _session(model, context_frames=2, decode=False) as session:
        pages = [model.step([session], [_actions(w)])[0].kv.pages_in_use for w in range(24)]
    assert max(pages[6:]) - min(pages[6:]) <= 1
    assert max(pages) <= pages[2] + 1


@pytest.mark.parametrize(
    "field, kwargs",
    [
        ("domain_id", {"domain_id": 32}),
        ("domain_id", {"domain_id": -1}),
        ("domain_id", {"domain_id": 1.0}),
        ("domain_id", {"domain_id": True}),
        ("prompt", {"prompt": ""}),
        ("prompt", {"prompt": 5}),
        ("image", {"image": np.zeros((32, 32), np.uint8)}),
        ("image", {"image": np.zeros((32, 32, 3), np.int32)}),
        ("image", {"image": np.full((32, 32, 3), 2.0, np.float32)}),
    ],
)
def test_bad_open_arguments_raise_before_work(model, field, kwargs):
    args = {"image": IMAGE, "prompt": "go", "domain_id": 8, **kwargs}
    with pytest.raises(ValueError, match=field):
        model.open_session(args["image"], args["prompt"], args["domain_id"])
    assert model.kv.num_used_pages == 0 and model.live_sessions == 0


def test_numpy_domain_id_is_accepted(model):
    session = model.open_session(IMAGE, "go", np.int64(31))
    assert session.domain_id == 31
    model.close(session)


@pytest.mark.parametrize(
    "knob, value",
    [("chunk_size", 6), ("chunk_size", 0), ("num_steps", 0), ("guidance_scale", 0.5), ("context_frames", -1),
     ("window_mode", "full"), ("flow_shift", 0.0), ("decode", "false"), ("num_steps", True)],
)
def test_bad_knobs_name_the_knob(knob, value):
    with pytest.raises(ValueError, match=knob):
        RolloutKnobs(**{knob: value})


@pytest.mark.parametrize(
    "actions",
    [np.zeros((3, 10), np.float32), np.zeros((4, 17), np.float32), np.full((4, 2), np.nan, np.float32),
     np.full((4, 2), np.inf, np.float32), np.zeros((4,), np.float32), "left", np.zeros((4, 2), bool)],
)
def test_bad_actions_rejected_and_session_stays_usable(model, actions):
    with _session(model, decode=False) as session:
        model.step([session], [_actions(0)])[0]
        pages, index = model.kv.num_used_pages, session.window_index
        with pytest.raises(ValueError, match="actions"):
            model.step([session], [actions])[0]
        assert model.kv.num_used_pages == pages and session.window_index == index
        assert model.step([session], [_actions(1)])[0].window_index == 1


def test_pool_exhaustion_is_a_clear_error_and_nothing_is_lost(tmp_path, architecture):
    path = build_checkpoint(tmp_path / "small", architecture)
    small = Cosmos3WorldModel.from_pretrained(path, device="cpu", num_pages=20, page_size=16)
    session = small.open_session(IMAGE, "go", 1, knobs=RolloutKnobs(num_steps=1, decode=False), action_width=10)
    with pytest.raises(KVPoolExhausted) as info:
        for w in range(20):
            small.step([session], [_actions(w)])[0]
    assert info.value.needed > info.value.free
    committed = small.kv_stats(session).seq_len
    assert committed > 0 and not session.closed  # the rejected window lost nothing
    small.close(session)
    assert small.kv.num_used_pages == 0


def test_failure_inside_a_window_returns_everything(model, monkeypatch):
    from worldstep.engine.models.cosmos3 import window

    session = _open(model)
    model.step([session], [_actions(0)])[0]
    monkeypatch.setattr(window, "_commit", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("injected")))
    with pytest.raises(RuntimeError, match="injected"):
        model.step([session], [_actions(1)])[0]
    assert session.closed
    assert model.kv.num_used_pages == 0 and model.decoder.live_warm_sessions == 0 and model.live_sessions == 0


def test_missing_checkpoint_names_where_it_looked(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match=str(tmp_path / "nowhere")):
        Cosmos3WorldModel.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "partial" / "vae").mkdir(parents=True)
    with pytest.raises(CheckpointNotFoundError, match="transformer"):
        Cosmos3WorldModel.from_pretrained(tmp_path / "partial")


def test_embedded_checkpoint_is_built_once(tmp_path, architecture):
    first = ensure_embedded_checkpoint("tiny", architecture, cache_dir=tmp_path)
    stamp = (first / "transformer" / "config.json").stat().st_mtime_ns
    again = ensure_embedded_checkpoint("tiny", architecture, cache_dir=tmp_path)
    assert again == first and (again / "transformer" / "config.json").stat().st_mtime_ns == stamp


def test_memory_pressure_offloads_idle_sessions_bit_identically(tmp_path, architecture):
    path = build_checkpoint(tmp_path / "p", architecture)
    knobs = RolloutKnobs(num_steps=1, decode=False)

    def run(model, interleave):
        a = model.open_session(IMAGE, "go", 1, knobs=knobs, generator=torch.Generator().manual_seed(1), action_width=10)
        b = model.open_session(IMAGE, "stop", 2, knobs=knobs, generator=torch.Generator().manual_seed(2),
                               action_width=10)
        out, offloaded = [], False
        for w in range(4):
            out.append(model.step([a], [_actions(w)])[0].latents)
            offloaded |= model.kv.is_offloaded(b.session_id)
            if interleave:
                model.step([b], [_actions(w + 10)])[0]
        model.close(a), model.close(b)
        return out, offloaded

    roomy = Cosmos3WorldModel.from_pretrained(path, device="cpu", num_pages=128, page_size=16)
    expected, _ = run(roomy, interleave=False)
    tight = Cosmos3WorldModel.from_pretrained(path, device="cpu", num_pages=34, page_size=16, cpu_offload_pages=64)
    got, offloaded = run(tight, interleave=True)  # two sessions do not fit: steps offload the idle one
    assert offloaded
    for x, y in zip(expected, got):
        assert torch.equal(x, y)
    assert tight.kv.num_used_pages == 0 and tight.kv.num_free_cpu_pages == 64
    no_offload = Cosmos3WorldModel.from_pretrained(path, device="cpu", num_pages=34, page_size=16)
    with pytest.raises(KVPoolExhausted):
        run(no_offload, interleave=True)
    no_offload.close_all()
    assert no_offload.kv.num_used_pages == 0


def test_close_from_another_thread_stops_the_window_and_returns_everything(model, monkeypatch):
    import threading

    from worldstep.engine.models.cosmos3 import window
    from worldstep.engine.session import SessionClosedError

    session = _open(model, num_steps=3, decode=False)
    other = _open(model, seed=5, num_steps=3, decode=False)
    model.step([session], [_actions(0)])[0]
    started, closer_done = threading.Event(), threading.Event()
    real = window.gen_forward

    def slow_forward(*args, **kwargs):
        started.set()
        closer_done.wait(timeout=0.2)
        return real(*args, **kwargs)

    monkeypatch.setattr(window, "gen_forward", slow_forward)
    closer = threading.Thread(target=lambda: (started.wait(5), model.close(session), closer_done.set()))
    closer.start()
    state = other.generator.get_state()
    with pytest.raises(SessionClosedError):
        model.step([session, other], [_actions(1), _actions(2)])
    closer.join(5)
    assert session.closed and not other.closed
    assert torch.equal(other.generator.get_state(), state)  # the survivor was rolled back, not advanced
    monkeypatch.setattr(window, "gen_forward", real)
    assert model.step([other], [_actions(2)])[0].window_index == 0
    model.close(other)
    assert model.kv.num_used_pages == 0 and model.live_sessions == 0


def test_keyboard_interrupt_mid_window_returns_everything(model, monkeypatch):
    from worldstep.engine.models.cosmos3 import window

    session = _open(model)
    monkeypatch.setattr(window, "_denoise", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        model.step([session], [_actions(0)])[0]
    assert session.closed and model.kv.num_used_pages == 0 and model.decoder.live_warm_sessions == 0


def test_a_session_resolves_its_constants_once_and_only_postprocess_moves_its_plan(model):
    """The step reads what a session resolved at open (keys, retention, plan); the postprocess moves the plan."""
    with _session(model, context_frames=2, guidance_scale=3.0) as session:
        assert [k.label.value for k in session.keys] == ["main", "uncond"]
        assert [model.kv.page_table(k).protected_prefix_tokens for k in session.keys] == \
            [session.retention[k.label].protected_tokens for k in session.keys]
        plans = [session.plan]
        for seed in range(3):
            model.step([session], [_actions(seed)])
            plans.append(session.plan)
        assert plans == [session.schedule.window(i) for i in range(4)] and session.window_index == 3
        fork = model.fork(session)
        try:
            assert fork.plan == session.plan and fork.keys != session.keys and fork.retention == session.retention
        finally:
            model.close(fork)
