"""PageAllocator: ids and reference counts only; invariants after any sequence of operations."""

import ast
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from worldstep.engine.kv import KVPoolExhausted, PageAllocator
from worldstep.engine.kv import allocator as allocator_module


def assert_partition(a: PageAllocator) -> None:
    free = list(a.free_page_ids)
    assert len(free) == len(set(free)), "a page is free twice"
    assert set(free).isdisjoint(a.used_page_ids)
    assert set(free) | a.used_page_ids == set(range(a.num_pages))
    assert all(r >= 0 for r in a.ref_counts)
    assert all((a.ref_counts[p] > 0) == (p in a.used_page_ids) for p in range(a.num_pages))
    assert a.num_free + a.num_used == a.num_pages


def test_allocate_and_free_round_trip():
    a = PageAllocator(4)
    pages = a.allocate(3)
    assert len(set(pages)) == 3 and a.num_free == 1 and a.num_used == 3
    assert all(a.ref_count(p) == 1 for p in pages)
    assert sorted(a.free(pages)) == sorted(pages)
    assert a.num_free == 4
    assert_partition(a)


def test_exhaustion_allocates_nothing_and_names_counts():
    a = PageAllocator(3)
    a.allocate(2)
    assert not a.can_allocate(2)
    with pytest.raises(KVPoolExhausted) as info:
        a.allocate(2)
    assert (info.value.needed, info.value.free) == (2, 1)
    assert "2 pages needed" in str(info.value) and "1 free" in str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert a.num_free == 1
    assert_partition(a)


def test_shared_page_returns_to_pool_only_at_zero():
    a = PageAllocator(2)
    [p] = a.allocate(1)
    a.share([p])
    assert a.ref_count(p) == 2
    assert a.free([p]) == []
    assert p in a.used_page_ids
    assert a.free([p]) == [p]
    assert p in a.free_page_ids


def test_double_free_raises_and_changes_nothing():
    a = PageAllocator(3)
    p, q = a.allocate(2)
    with pytest.raises(ValueError, match="freed 2 times"):
        a.free([p, q, p])
    assert a.ref_count(p) == 1 and a.ref_count(q) == 1
    a.free([p])
    with pytest.raises(ValueError, match="not allocated"):
        a.free([p])
    with pytest.raises(ValueError, match="not allocated"):
        a.share([p])
    assert_partition(a)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_bad_counts_raise(bad):
    a = PageAllocator(2)
    with pytest.raises(ValueError):
        a.allocate(bad)
    with pytest.raises(ValueError):
        PageAllocator(bad)


def test_out_of_range_id_raises():
    a = PageAllocator(2)
    with pytest.raises(ValueError, match="page id"):
        a.ref_count(2)


def test_allocator_does_not_import_torch():
    tree = ast.parse(Path(allocator_module.__file__).read_text())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        (node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    }
    assert "torch" not in imported


ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "share", "free"]), st.integers(0, 6), st.integers(0, 10**6)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_random_sequences_keep_invariants(seq):
    a = PageAllocator(8)
    held: list[int] = []  # one entry per reference we hold
    for op, n, pick in seq:
        if op == "alloc":
            if a.can_allocate(n):
                held += a.allocate(n)
            else:
                before = (list(a.free_page_ids), set(a.used_page_ids))
                with pytest.raises(KVPoolExhausted):
                    a.allocate(n)
                assert (list(a.free_page_ids), set(a.used_page_ids)) == before
        elif op == "share" and held:
            page = held[pick % len(held)]
            a.share([page])
            held.append(page)
        elif op == "free" and held:
            page = held.pop(pick % len(held))
            returned = a.free([page])
            assert returned == ([page] if page not in held else [])
        assert_partition(a)
        assert all(a.ref_counts[p] == held.count(p) for p in range(a.num_pages))
