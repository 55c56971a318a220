"""WindowSchedule / RetentionPolicy: tiling, release bounds, knob validation, open-ended schedules."""

import ast
import itertools
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from worldstep.engine import windowing
from worldstep.engine.kv import PagedKVCache, StreamKey, StreamLabel
from worldstep.engine.models.cosmos3 import RolloutKnobs
from worldstep.engine.models.cosmos3.session import window_schedule
from worldstep.engine.windowing import RetentionPolicy, WindowPlan, WindowSchedule


@st.composite
def schedules(draw, open_ended=False):
    window = draw(st.integers(1, 12))
    lead = draw(st.integers(0, 3))
    overlap = draw(st.integers(0, lead + window))
    context = draw(st.one_of(st.just(0), st.integers(max(overlap, 1), 30)))
    total = None if open_ended else draw(st.integers(lead + 1, 80))
    return WindowSchedule(total, window, context_units=context, overlap_units=overlap, lead_units=lead)


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_commit_spans_tile_the_sequence_exactly(s):
    plans = list(s.windows())
    assert len(plans) == s.num_windows
    assert [p.index for p in plans] == list(range(s.num_windows))
    assert plans[0].commit_start == 0 and plans[0].cond_units == s.lead_units  # the lead is committed with it
    for prev, nxt in itertools.pairwise(plans):
        assert nxt.commit_start == prev.commit_end == nxt.new_start  # no gap, no double generation
        assert nxt.cond_units == s.overlap_units == prev.end - nxt.start  # the overlap is the tail before
    assert plans[-1].commit_end == s.total_units
    for p in plans:
        assert p.new_start < p.end  # every window generates something
        assert p.end - p.new_start <= s.window_units
        assert p.end - p.new_start == s.window_units or p is plans[-1]  # only the last may be short


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_release_never_reaches_the_next_window(s):
    ends = [s.released_end(i) for i in range(s.num_windows)]
    assert ends == sorted(ends)  # releases only move forward
    for i in range(s.num_windows - 1):
        assert ends[i] <= s.window(i + 1).start
    for i, end in enumerate(ends):
        if s.context_units == 0:
            assert end == 0
        else:
            assert end == max(0, s.window(i).commit_end - s.context_units)


def test_reference_review_case_is_rejected():
    # released_end(0) would be 3 while window 1 starts at 2: unit 2 freed under window 1
    with pytest.raises(ValueError, match="context_units"):
        WindowSchedule(total_units=10, window_units=2, overlap_units=2, context_units=1, lead_units=2)
    ok = WindowSchedule(total_units=10, window_units=2, overlap_units=2, context_units=2, lead_units=2)
    assert ok.released_end(0) == ok.window(1).start == 2


@pytest.mark.parametrize(
    ("kwargs", "knob"),
    [
        ({"total_units": 10, "window_units": 0}, "window_units"),
        ({"total_units": 10, "window_units": 4, "overlap_units": -1}, "overlap_units"),
        ({"total_units": 10, "window_units": 4, "overlap_units": 5}, "overlap_units"),
        ({"total_units": 10, "window_units": 4, "lead_units": -1}, "lead_units"),
        ({"total_units": 2, "window_units": 4, "lead_units": 2}, "total_units"),
        ({"total_units": 10, "window_units": 4, "context_units": -1}, "context_units"),
        ({"total_units": 10, "window_units": 4, "overlap_units": 3, "context_units": 2}, "context_units"),
        ({"total_units": 0, "window_units": 4}, "total_units"),
        ({"total_units": 10.0, "window_units": 4}, "total_units"),
        ({"total_units": 10, "window_units": True}, "window_units"),
        ({"total_units": 10, "window_units": 4, "context_units": False}, "context_units"),
        ({"total_units": 10, "window_units": "4"}, "window_units"),
    ],
)
def test_invalid_knobs_raise_naming_the_knob(kwargs, knob):
    with pytest.raises(ValueError, match=knob):
        WindowSchedule(**kwargs)


def test_index_out_of_range_raises():
    s = WindowSchedule(10, 4)
    assert s.num_windows == 3 and s.window(2) == WindowPlan(2, 8, 10, 0, commit_start=8)
    for bad in (3, -1, True, 1.0):
        with pytest.raises(ValueError, match="index"):
            s.window(bad)
        with pytest.raises(ValueError, match="index"):
            s.released_end(bad)


def test_window_plan_properties():
    s = WindowSchedule(11, 3, overlap_units=1, context_units=3, lead_units=1)
    assert [(p.start, p.end, p.commit_start) for p in s.windows()] == [(0, 4, 0), (3, 7, 4), (6, 10, 7), (9, 11, 10)]
    last = s.window(3)
    assert (last.units, last.new_start, last.commit_start, last.commit_end) == (2, 10, 10, 11)


@pytest.mark.parametrize("chunk", [4, 8, 16])
def test_a_sessions_schedule_is_cosmos3_window_geometry(chunk):
    """Frame 0 is the clean lead; kv windows generate chunk/4 latent frames each, attending to the committed
    ones; chained windows re-pin their predecessor's last frame as clean conditioning."""
    n = chunk // 4
    kv = window_schedule(RolloutKnobs(chunk_size=chunk, context_frames=2))
    assert [(p.start, p.end, p.cond_units) for p in itertools.islice(kv.windows(), 3)] == [
        (0, 1 + n, 1), (1 + n, 1 + 2 * n, 0), (1 + 2 * n, 1 + 3 * n, 0)]
    assert kv.context_units == 2
    chained = window_schedule(RolloutKnobs(chunk_size=chunk, window_mode="chained"))
    assert [(p.start, p.end, p.cond_units) for p in itertools.islice(chained.windows(), 3)] == [
        (0, 1 + n, 1), (n, 1 + 2 * n, 1), (2 * n, 1 + 3 * n, 1)]


def test_open_ended_schedule_runs_for_ever():
    s = WindowSchedule(None, 3, context_units=6, overlap_units=1, lead_units=1)
    assert s.num_windows is None
    first = list(itertools.islice(s.windows(), 100))
    assert [p.index for p in first] == list(range(100))
    big = s.window(10**6)
    assert big.start == 3 * 10**6 and big.units == 4
    assert s.released_end(10**6) == big.commit_end - 6
    with pytest.raises(ValueError, match="index"):
        s.window(-1)


@settings(max_examples=60, deadline=None)
@given(schedules(open_ended=True))
def test_open_ended_matches_a_long_finite_schedule(s):
    finite = WindowSchedule(10_000, s.window_units, s.context_units, s.overlap_units, s.lead_units)
    for i in range(20):
        assert s.window(i) == finite.window(i)
        assert s.released_end(i) == finite.released_end(i)


def test_retention_policy():
    s = WindowSchedule(None, 2, context_units=3)
    assert WindowSchedule(None, 2).retention(16, 8) is None
    policy = s.retention(16, 8)
    assert policy == RetentionPolicy(protected_tokens=8, context_tokens=48)
    assert policy.tokens_to_release(8 + 48) == 0 and policy.tokens_to_release(100) == 44
    with pytest.raises(ValueError, match="tokens_per_unit"):
        s.retention(0, 8)
    with pytest.raises(ValueError, match="prefix_tokens"):
        s.retention(16, -1)
    with pytest.raises(ValueError, match="context_tokens"):
        RetentionPolicy(0, -1)
    with pytest.raises(ValueError, match="seq_len"):
        policy.tokens_to_release(-1)


@settings(max_examples=80, deadline=None)
@given(
    schedules(),
    st.integers(1, 12),  # tokens per unit
    st.integers(0, 20),  # prefix tokens
    st.sampled_from([1, 4, 8]),  # page size
)
def test_retention_through_the_cache_tracks_released_end_within_a_page(s, tpu, prefix, page_size):
    """Drive a real stream window by window: released tokens stay within a page of the schedule's."""
    assume(s.context_units > 0)
    pages = 2 + (prefix + (s.total_units + 1) * tpu) // page_size
    cache = PagedKVCache(num_layers=1, num_pages=pages, page_size=page_size, num_kv_heads=1, head_dim=1)
    key = StreamKey("s", StreamLabel.MAIN)
    cache.table.create_stream(key)
    cache.append(key, torch.zeros(1, prefix, 1, 1), torch.zeros(1, prefix, 1, 1))
    cache.table.protect_prefix(key, prefix)
    policy = s.retention(tpu, prefix)
    straddle = -(-prefix // page_size) * page_size - prefix  # unprotected slots in the boundary page
    for plan in s.windows():
        n = (plan.commit_end - plan.commit_start) * tpu
        cache.append(key, torch.zeros(1, n, 1, 1), torch.zeros(1, n, 1, 1))
        cache.table.apply_retention(key, policy)
        released = cache.page_table(key).released_tokens
        target = s.released_end(plan.index) * tpu
        assert released <= target  # never inside the context
        assert target - released < page_size + straddle


def test_windowing_imports_neither_torch_nor_model_code():
    tree = ast.parse(Path(windowing.__file__).read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m.split(".")[0] == "torch" or "models" in m or "kv" in m for m in modules)
    assert {m for m in modules if "worldstep" in m} <= {"worldstep.engine.checks"}
