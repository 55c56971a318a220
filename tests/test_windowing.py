"""WindowSchedule / RetentionPolicy: tiling, release bounds, knob validation, open-ended schedules."""

import ast
import itertools
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from worldstep.engine import windowing
from worldstep.engine.config import RolloutKnobs
from worldstep.engine.kv import PagedKVCache, StreamKey, StreamLabel
from worldstep.engine.session import window_schedule
from worldstep.engine.windowing import RetentionPolicy, WindowPlan, WindowSchedule


@st.composite
def schedules(draw, open_ended=False):
    window = draw(st.integers(1, 12))
    overlap = draw(st.integers(0, window - 1))
    context = draw(st.one_of(st.just(0), st.integers(max(overlap, 1), 30)))
    total = None if open_ended else draw(st.integers(1, 80))
    return WindowSchedule(total, window, context_units=context, overlap_units=overlap)


# The reference module doc's sentences, as worked examples.


def test_windows_of_window_units_advance_by_window_minus_overlap():
    """"total_units are generated in windows of window_units advancing by window_units - overlap_units"."""
    s = WindowSchedule(total_units=10, window_units=4, overlap_units=2)
    assert [(p.start, p.end) for p in s.windows()] == [(0, 4), (2, 6), (4, 8), (6, 10)]
    assert {p.units for p in s.windows()} == {4}  # windows of window_units, not window + overlap


def test_the_final_window_may_be_short():
    """"the final window may be short"."""
    s = WindowSchedule(total_units=11, window_units=4, overlap_units=1)
    assert [(p.start, p.end) for p in s.windows()] == [(0, 4), (3, 7), (6, 10), (9, 11)]
    assert WindowSchedule(total_units=3, window_units=4).window(0) == WindowPlan(0, 0, 3, 0)


def test_cond_units_re_pin_the_previous_tail_and_commit_spans_generate_each_unit_once():
    """"The leading cond_units of the window re-pin the tail of the previous window as clean conditioning (0
    when there is no overlap)"; "commit_start:commit_end is the span this window newly generates"."""
    s = WindowSchedule(total_units=10, window_units=4, overlap_units=2)
    assert [(p.cond_units, p.commit_start, p.commit_end) for p in s.windows()] == [
        (0, 0, 4), (2, 4, 6), (2, 6, 8), (2, 8, 10)]
    assert [p.cond_units for p in WindowSchedule(10, 4).windows()] == [0, 0, 0]


def test_overlap_equal_to_the_window_is_refused():
    with pytest.raises(ValueError, match="overlap_units=4"):
        WindowSchedule(total_units=10, window_units=4, overlap_units=4)


def test_released_end_is_everything_older_than_the_context_behind_the_frontier():
    """"released_end(index): everything older than context_units behind the commit frontier. 0 when context is
    unbounded"."""
    s = WindowSchedule(total_units=10, window_units=4, overlap_units=2, context_units=3)
    assert [s.released_end(i) for i in range(s.num_windows)] == [1, 3, 5, 7]
    assert [WindowSchedule(10, 4).released_end(i) for i in range(3)] == [0, 0, 0]


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_commit_spans_tile_the_sequence_exactly(s):
    plans = list(s.windows())
    assert len(plans) == s.num_windows
    assert [p.index for p in plans] == list(range(s.num_windows))
    assert plans[0].commit_start == 0 and plans[0].cond_units == 0
    covered = [u for p in plans for u in range(p.commit_start, p.commit_end)]
    assert covered == list(range(s.total_units))  # every unit generated exactly once, in order
    for prev, nxt in itertools.pairwise(plans):
        assert nxt.start - prev.start == s.window_units - s.overlap_units
        assert nxt.cond_units == s.overlap_units == prev.end - nxt.start  # the overlap is the tail before
    for p in plans:
        assert p.commit_start < p.end  # every window generates something
        assert p.units == s.window_units or p is plans[-1]  # only the last may be short


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
    # released_end(0) would be 3 while window 1 starts at 1: unit 1..2 freed under window 1
    with pytest.raises(ValueError, match="context_units"):
        WindowSchedule(total_units=10, window_units=4, overlap_units=3, context_units=1)
    ok = WindowSchedule(total_units=10, window_units=4, overlap_units=3, context_units=3)
    assert ok.released_end(0) == ok.window(1).start == 1


@pytest.mark.parametrize(
    ("kwargs", "knob"),
    [
        ({"total_units": 10, "window_units": 0}, "window_units"),
        ({"total_units": 10, "window_units": 4, "overlap_units": -1}, "overlap_units"),
        ({"total_units": 10, "window_units": 4, "overlap_units": 5}, "overlap_units"),
        ({"total_units": 10, "window_units": 4, "overlap_units": 4}, "overlap_units"),
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
    assert s.num_windows == 3 and s.window(2) == WindowPlan(2, 8, 10, 0)
    for bad in (3, -1, True, 1.0):
        with pytest.raises(ValueError, match="index"):
            s.window(bad)
        with pytest.raises(ValueError, match="index"):
            s.released_end(bad)


def test_window_plan_properties():
    s = WindowSchedule(11, 4, overlap_units=1, context_units=3)
    assert [(p.start, p.end, p.commit_start) for p in s.windows()] == [(0, 4, 0), (3, 7, 4), (6, 10, 7), (9, 11, 10)]
    last = s.window(3)
    assert (last.units, last.cond_units, last.commit_start, last.commit_end) == (2, 1, 10, 11)


@pytest.mark.parametrize("chunk", [4, 8, 16])
def test_a_sessions_schedule_is_cosmos3_window_geometry(chunk):
    """Frame 0 is the clean lead; kv windows generate chunk/4 latent frames each, attending to the committed
    ones; chained windows re-pin their predecessor's last frame as clean conditioning. Both are a reference
    schedule: kv windows of n over frames 1.., chained windows of n + 1 overlapping by 1 over frames 0.."""
    n = chunk // 4
    kv = window_schedule(RolloutKnobs(chunk_size=chunk, context_frames=2))
    assert [(p.start, p.end, p.cond_units) for p in itertools.islice(kv.windows(), 3)] == [
        (0, 1 + n, 1), (1 + n, 1 + 2 * n, 0), (1 + 2 * n, 1 + 3 * n, 0)]
    assert kv.context_units == 2 and kv.schedule == WindowSchedule(None, n, context_units=2)
    chained = window_schedule(RolloutKnobs(chunk_size=chunk, window_mode="chained"))
    assert [(p.start, p.end, p.cond_units) for p in itertools.islice(chained.windows(), 3)] == [
        (0, 1 + n, 1), (n, 1 + 2 * n, 1), (2 * n, 1 + 3 * n, 1)]
    assert chained.schedule == WindowSchedule(None, n + 1, overlap_units=1)


def test_open_ended_schedule_runs_for_ever():
    s = WindowSchedule(None, 4, context_units=6, overlap_units=1)
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
    finite = WindowSchedule(10_000, s.window_units, s.context_units, s.overlap_units)
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
    cache.create_stream(key)
    cache.append(key, torch.zeros(1, prefix, 1, 1), torch.zeros(1, prefix, 1, 1))
    cache.protect_prefix(key, prefix)
    policy = s.retention(tpu, prefix)
    straddle = -(-prefix // page_size) * page_size - prefix  # unprotected slots in the boundary page
    for plan in s.windows():
        n = (plan.commit_end - plan.commit_start) * tpu
        cache.append(key, torch.zeros(1, n, 1, 1), torch.zeros(1, n, 1, 1))
        cache.apply_retention(key, policy)
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
