"""One `env.step` crosses no layer that only hands its arguments on.

The step path once went through facades that took a lock and delegated (`PagedKVCache.page_table` to
`self.table.page_table`), a closure, a no-grad wrapper and a lambda around one attention call. `forwards`
(tests/perf/trace_step.py) finds such a function from its source; this test traces one step of
worldstep/Tiny-v0 and requires none on the path (nor a closure or lambda, but the lock's decorator), and first
shows the finder catching injected ones. On the tree this issue started from (20c0d61) it finds three:
`RolloutSession.plan`, `embed_actions` (a no-grad twin of `action_tokens`) and `project_out`.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent / "perf"))
from trace_step import INLINE, forwards, tiny_env, trace_env_step  # noqa: E402


class _Facade:
    """Injected violations, and near misses that do work of their own."""

    def __init__(self, table) -> None:
        self.table, self.lock = table, threading.Lock()

    def page_table(self, key):
        with self.lock:
            return self.table.page_table(key)

    def pages_for(self, tokens, *args, **kwargs):
        """A docstring does not make it work."""
        return self.table.pages_for(tokens, *args, page_size=self.table.page_size, **kwargs)

    def pages_after(self, tokens):
        return self.table.pages_for(tokens + 1)  # computes its argument

    def count(self):
        return len(self.table.pages)  # a builtin over an attribute: a read, not a layer

    def embedding(self, t):
        return self.table.embed(self.table.full(t)).to(self.table.dtype)  # the last call is not the work

    def append(self, key, keys, values):
        self.table.reserve(key)
        self.table.commit(key, keys, values)


def test_the_finder_catches_facades_and_passes_functions_that_work():
    found = {name: forwards(getattr(_Facade, name).__code__) for name in vars(_Facade) if not name.startswith("__")}
    assert found == {
        "page_table": "return self.table.page_table(key)",
        "pages_for": "return self.table.pages_for(tokens, *args, page_size=self.table.page_size, **kwargs)",
        "pages_after": None, "count": None, "embedding": None, "append": None}


def test_one_env_step_crosses_no_forwarder():
    env = tiny_env()
    try:
        trace = trace_env_step(env, np.zeros(env.action_space.shape, env.action_space.dtype))
    finally:
        env.close()
    assert len(trace.codes) == trace.functions > 50
    assert {call: stmt for call, code in trace.codes.items() if (stmt := forwards(code))} == {}
    closures = [call for call in trace.calls if "<locals>" in call and not call.endswith(INLINE)]
    assert closures == ["engine/kv/cache.py:locked.<locals>.call"]  # the one lock's decorator, nothing else
