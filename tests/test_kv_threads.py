"""Two threads hammer one pool (grow / release / offload / reload / fork / remove on their own sessions) through
the cache's API, and the cache holds the one lock over its table and offload."""

import random
import sys
import threading

import torch
from worldstep.engine.kv import PagedKVCache, StreamKey, StreamLabel, check_invariants
from worldstep.engine.windowing import RetentionPolicy

L, HKV, D, PS = 2, 2, 4, 4
ROUNDS = 150


def tokens(start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.arange(start, start + n, dtype=torch.float32)
    k = (ids.view(1, n, 1, 1) + 0.25 * torch.arange(L).view(L, 1, 1, 1)).expand(L, n, HKV, D).clone()
    return k, -k


def worker(cache: PagedKVCache, name: str, seed: int, errors: list[BaseException]) -> None:
    rng = random.Random(seed)
    key, fork_key = StreamKey(name, StreamLabel.MAIN), StreamKey(name + "-fork", StreamLabel.MAIN)
    held: list[int] = []
    next_id = seed * 1_000_000
    try:
        cache.create_stream(key)
        cache.append(key, *tokens(next_id, 6))
        held, next_id = list(range(next_id, next_id + 6)), next_id + 6
        cache.protect_prefix(key, 6)
        policy = RetentionPolicy(protected_tokens=6, context_tokens=12)
        for _ in range(ROUNDS):
            n = rng.randint(1, 9)
            cache.append(key, *tokens(next_id, n))
            held += range(next_id, next_id + n)
            next_id += n
            released = cache.apply_retention(key, policy)
            first = -(-6 // PS) * PS
            del held[first : first + released]
            op = rng.random()
            if op < 0.3:
                assert cache.offload_session(name)
                assert cache.pages_in_use(name) == 0
                cache.reload_session(name)
            elif op < 0.45 and not cache.stream_keys(fork_key.session_id):
                cache.fork_session(name, fork_key.session_id)
            elif op < 0.6 and cache.stream_keys(fork_key.session_id):
                cache.remove(fork_key)
            k, v = cache.gather(key, rng.randrange(L))
            ids = (k[:, 0, 0] - k[0, 0, 0] + held[0]).round().long().tolist()
            assert ids == held, f"{name}: stream content diverged"
            assert torch.equal(v, -k)
    except BaseException as exc:  # surface in the main thread
        errors.append(exc)


def auditor(cache: PagedKVCache, done: threading.Event, errors: list[BaseException]) -> None:
    """Reads the whole pool while the workers write: every read must see a consistent state."""
    try:
        while not done.is_set():
            check_invariants(cache)  # one locked read of pools and streams together
    except BaseException as exc:
        errors.append(exc)


def test_two_threads_keep_pool_consistent():
    cache = PagedKVCache(
        num_layers=L, num_pages=64, page_size=PS, num_kv_heads=HKV, head_dim=D, cpu_offload_pages=64
    )
    errors: list[BaseException] = []
    threads = [threading.Thread(target=worker, args=(cache, f"s{i}", i + 1, errors)) for i in range(2)]
    done = threading.Event()
    audit = threading.Thread(target=auditor, args=(cache, done, errors))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads between almost every bytecode, so races show up
    try:
        audit.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        done.set()
        audit.join(timeout=60)
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in [*threads, audit])
    assert not errors, errors
    check_invariants(cache)
    for name in ("s0", "s1"):
        assert cache.page_table(StreamKey(name, StreamLabel.MAIN)).protected_prefix_tokens == 6
        cache.remove_session(name)
        cache.remove_session(name + "-fork")
    assert cache.num_free_pages == 64 and cache.num_used_pages == 0
    assert cache.num_free_cpu_pages == 64


def _locks(obj, seen: set[int] | None = None) -> list[tuple[str, object]]:
    """(owner.attribute, lock) of every lock held by ``obj`` and the KV objects it reaches, each object once."""
    seen = set() if seen is None else seen
    seen.add(id(obj))
    lock_types = (type(threading.Lock()), type(threading.RLock()))
    found = []
    for name, value in vars(obj).items():
        if isinstance(value, lock_types):
            found.append((f"{type(obj).__name__}.{name}", value))
        elif type(value).__module__.startswith("worldstep.engine.kv") and id(value) not in seen:
            found += _locks(value, seen)
    return found


def test_one_lock_over_the_cache_table_and_offload():
    cache = PagedKVCache(num_layers=L, num_pages=8, page_size=PS, num_kv_heads=HKV, head_dim=D, cpu_offload_pages=8)
    assert _locks(cache) == [("PagedKVCache.lock", cache.lock)]
    cache.offload.lock = threading.RLock()  # an injected second lock (the offload guarding itself) is seen
    assert sorted(path for path, _ in _locks(cache)) == ["Offload.lock", "PagedKVCache.lock"]
