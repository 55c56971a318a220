"""Random sequences of cache operations against a pure-Python model of what each stream holds.

After every step: no page leaked or double-freed, ref counts equal stream references, protected
heads intact, every surviving token reads back bit-identical, seq_len/released/epoch consistent,
forks independent.
"""

from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from worldstep.engine.kv import KVPoolExhausted, PagedKVCache, StreamKey, StreamLabel, check_invariants
from worldstep.engine.windowing import RetentionPolicy

L, HKV, D, PS = 2, 1, 2, 4
NUM_PAGES, CPU_PAGES = 12, 8
SESSIONS = ["a", "b", "c"]
PICK = st.integers(0, 10**6)
KEYS = [StreamKey(s, label) for s in SESSIONS for label in StreamLabel]


def tokens(start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.arange(start, start + n, dtype=torch.float32)
    k = ids.view(1, n, 1, 1) + 0.25 * torch.arange(L, dtype=torch.float32).view(L, 1, 1, 1)
    k = k.expand(L, n, HKV, D).clone()
    return k, -k


@dataclass
class Expected:
    tokens: list[int] = field(default_factory=list)
    protected: int = 0
    released: int = 0


class KVMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cache = PagedKVCache(
            num_layers=L, num_pages=NUM_PAGES, page_size=PS, num_kv_heads=HKV, head_dim=D,
            cpu_offload_pages=CPU_PAGES,
        )
        self.model: dict[tuple[str, str], Expected] = {}
        self.offloaded: dict[str, dict] = {}  # session -> {key: device pages it held before offload}
        self.epochs: dict[tuple[str, str], int] = {}
        self.changed: set[tuple[str, str]] = set()
        self.next_token = 0

    # helpers

    def pick(self, choice: int) -> tuple[str, str]:
        """Mostly an existing stream (so sequences get deep), sometimes any key (misuse paths)."""
        existing = sorted(self.model)
        if existing and choice % 5:
            return existing[choice % len(existing)]
        return KEYS[choice % len(KEYS)]

    def keys_of(self, session: str) -> list[tuple[str, str]]:
        return [key for key in self.model if key.session_id == session]

    def usable(self, key) -> bool:
        """Whether ``key`` can be operated on; otherwise check that the cache refuses."""
        if key not in self.model:
            with pytest.raises(KeyError):
                self.cache.page_table(key)
            return False
        if key.session_id in self.offloaded:
            with pytest.raises(ValueError, match="offloaded"):
                self.cache.gather(key, 0)
            return False
        return True

    def expect_release(self, key, n: int, got: int) -> None:
        e = self.model[key]
        first = -(-e.protected // PS)
        n_pages = min(n // PS, max(0, len(e.tokens) // PS - first))
        assert got == n_pages * PS
        del e.tokens[first * PS : (first + n_pages) * PS]
        e.released += got
        if got:
            self.changed.add(key)

    # rules

    @initialize(sizes=st.lists(st.integers(1, 14), min_size=1, max_size=3))
    def start_with_content(self, sizes):
        """Begin from live streams so short runs still reach release, fork and offload."""
        starts = [StreamKey("a", StreamLabel.MAIN), StreamKey("b", StreamLabel.MAIN),
                  StreamKey("a", StreamLabel.UNCOND)]
        for key, n in zip(starts, sizes):
            self.cache.create_stream(key)
            self.cache.append(key, *tokens(self.next_token, n))
            self.model[key] = Expected(list(range(self.next_token, self.next_token + n)))
            self.next_token += n
            self.changed.add(key)

    @rule(key=st.sampled_from(KEYS))
    def create(self, key):
        if key in self.model or key.session_id in self.offloaded:
            with pytest.raises(ValueError):
                self.cache.create_stream(key)
            return
        self.cache.create_stream(key)
        self.model[key] = Expected()
        self.changed.add(key)

    @rule(choice=PICK, n=st.integers(0, 9))
    def append(self, choice, n):
        key = self.pick(choice)
        if not self.usable(key):
            return
        k, v = tokens(self.next_token, n)
        if not self.cache.can_append(key, n):
            before = (self.cache.page_table(key), self.cache.num_free_pages)
            with pytest.raises(KVPoolExhausted):
                self.cache.append(key, k, v)
            assert (self.cache.page_table(key), self.cache.num_free_pages) == before
            return
        self.cache.append(key, k, v)
        self.model[key].tokens += range(self.next_token, self.next_token + n)
        self.next_token += n
        if n:
            self.changed.add(key)

    @rule(choice=PICK, n=st.integers(0, 12))
    def protect(self, choice, n):
        key = self.pick(choice)
        if not self.usable(key):
            return
        e = self.model[key]
        n %= len(e.tokens) + 2  # mostly valid lengths, sometimes one past seq_len
        refused = n != e.protected and (e.released > 0 or e.protected > 0 or n > len(e.tokens))
        if refused:
            with pytest.raises(ValueError):
                self.cache.protect_prefix(key, n)
            return
        self.cache.protect_prefix(key, n)
        e.protected = n

    @rule(choice=PICK, n=st.integers(0, 20))
    def release(self, choice, n):
        key = self.pick(choice)
        if self.usable(key):
            self.expect_release(key, n, self.cache.release_oldest(key, n))

    @rule(choice=PICK, context=st.integers(0, 10))
    def retention(self, choice, context):
        key = self.pick(choice)
        if not self.usable(key):
            return
        e = self.model[key]
        policy = RetentionPolicy(e.protected, context)
        n = policy.tokens_to_release(len(e.tokens))
        self.expect_release(key, n, self.cache.apply_retention(key, policy))

    @rule(choice=PICK, dst_session=st.sampled_from(SESSIONS))
    def fork(self, choice, dst_session):
        src = self.pick(choice)
        dst = StreamKey(dst_session, src.label)
        if not self.usable(src):
            return
        if dst in self.model or dst_session in self.offloaded:
            with pytest.raises(ValueError):
                self.cache.fork(src, dst)
            return
        self.cache.fork(src, dst)
        e = self.model[src]
        self.model[dst] = Expected(list(e.tokens), e.protected, e.released)
        self.changed.add(dst)

    @rule(session=st.sampled_from(SESSIONS))
    def offload(self, session):
        keys = self.keys_of(session)
        if not keys or session in self.offloaded:
            with pytest.raises((KeyError, ValueError)):
                self.cache.offload_session(session)
            return
        before = {key: self.cache.page_table(key) for key in keys}
        distinct = len({p for t in before.values() for p in t.pages})
        free_before = (self.cache.num_free_pages, self.cache.num_free_cpu_pages)
        fits = distinct <= self.cache.num_free_cpu_pages
        assert self.cache.offload_session(session) is fits
        if fits:
            self.offloaded[session] = {key: set(t.pages) for key, t in before.items()}
        else:  # nothing freed, nothing changed
            assert {key: self.cache.page_table(key) for key in keys} == before
            assert (self.cache.num_free_pages, self.cache.num_free_cpu_pages) == free_before

    @rule(session=st.sampled_from(SESSIONS))
    def reload(self, session):
        if session not in self.offloaded:
            with pytest.raises(ValueError):
                self.cache.reload_session(session)
            return
        needed = len(set().union(*self.offloaded[session].values()))  # shared pages were saved once
        if needed > self.cache.num_free_pages:
            with pytest.raises(KVPoolExhausted):
                self.cache.reload_session(session)
            assert self.cache.is_offloaded(session)
            return
        self.cache.reload_session(session)
        del self.offloaded[session]
        self.changed.update(self.keys_of(session))

    @rule(choice=PICK)
    def remove(self, choice):
        key = self.pick(choice)
        if key not in self.model:
            with pytest.raises(KeyError):
                self.cache.remove(key)
            return
        pages = self.cache.page_table(key).pages
        sole = sum(self.cache.allocator.ref_count(p) == 1 for p in pages)
        assert self.cache.remove(key) == sole
        del self.model[key]
        self.epochs.pop(key, None)
        self.offloaded.get(key.session_id, {}).pop(key, None)
        if not self.keys_of(key.session_id):
            self.offloaded.pop(key.session_id, None)

    @rule(session=st.sampled_from(SESSIONS))
    def remove_session(self, session):
        free_before = self.cache.num_free_pages
        returned = self.cache.remove_session(session)
        assert self.cache.num_free_pages == free_before + returned
        for key in self.keys_of(session):
            del self.model[key]
            self.epochs.pop(key, None)
        self.offloaded.pop(session, None)
        assert self.cache.pages_in_use(session) == 0

    # invariants

    @invariant()
    def pools_are_consistent(self):
        check_invariants(self.cache)
        a = self.cache.allocator
        free = list(a.free_page_ids)
        assert len(free) == len(set(free)) and set(free).isdisjoint(a.used_page_ids)
        assert set(free) | a.used_page_ids == set(range(NUM_PAGES))
        refs = [0] * NUM_PAGES
        for key in self.model:
            for p in self.cache.page_table(key).pages:
                refs[p] += 1
        assert refs == a.ref_counts
        assert sorted(self.cache.stream_keys()) == sorted(self.model)

    @invariant()
    def streams_hold_what_the_model_says(self):
        for key, e in self.model.items():
            t = self.cache.page_table(key)
            assert (t.seq_len, t.protected_prefix_tokens, t.released_tokens) == (len(e.tokens), e.protected, e.released)
            assert len(t.pages) == (0 if key.session_id in self.offloaded else -(-len(e.tokens) // PS))
            if key.session_id in self.offloaded:
                continue
            for layer in range(L):
                k, v = self.cache.gather(key, layer)
                expected_k = tokens(0, 0)[0][layer]
                if e.tokens:
                    expected_k = torch.cat([tokens(i, 1)[0][layer] for i in e.tokens])
                assert torch.equal(k, expected_k) and torch.equal(v, -expected_k)

    @invariant()
    def epochs_move_exactly_when_content_changes(self):
        for key in self.model:
            epoch = self.cache.page_table(key).prefix_epoch
            if key in self.changed or key not in self.epochs:
                assert epoch > self.epochs.get(key, 0)
            else:
                assert epoch == self.epochs[key]
            self.epochs[key] = epoch
        assert len(set(self.epochs.values())) == len(self.epochs)
        self.changed.clear()


KVMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestKVMachine = KVMachine.TestCase
