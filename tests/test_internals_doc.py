"""`docs/internals.md` matches the code: one traced `env.step` of worldstep/Tiny-v0 runs every function the data
path names, in the doc's order."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "tests" / "perf"))
from trace_step import tiny_env, trace_env_step  # noqa: E402

HOP = re.compile(r"^\d+\. `([\w.]+)` \(`([\w/.]+)`\)", re.MULTILINE)


def doc_hops(text: str) -> list[str]:
    """``file:qualname`` of every numbered hop of the data-path section, in order."""
    section = text.split("## The data path of one `env.step`", 1)[1].split("\n## ", 1)[0]
    return [f"{path}:{name}" for name, path in HOP.findall(section)]


def first_in_order(hops: list[str], calls: list[str]) -> list[str]:
    """Problems: hops never called, or called before the hop the doc puts ahead of them."""
    problems, last = [], -1
    for hop in hops:
        if hop not in calls:
            problems.append(f"{hop} is not on the path")
            continue
        at = calls.index(hop)
        if at < last:
            problems.append(f"{hop} runs before the hop the doc puts ahead of it")
        last = max(last, at)
    return problems


def test_the_checker_fails_on_a_wrong_doc():
    calls = ["envs/a.py:A.step", "engine/b.py:b", "engine/c.py:c"]
    assert first_in_order(["envs/a.py:A.step", "engine/c.py:c"], calls) == []
    assert first_in_order(["engine/c.py:c", "engine/b.py:b"], calls) == [
        "engine/b.py:b runs before the hop the doc puts ahead of it"]
    assert first_in_order(["engine/x.py:Model.decode"], calls) == ["engine/x.py:Model.decode is not on the path"]


def test_every_function_the_doc_names_is_on_one_env_step_in_order():
    hops = doc_hops((ROOT / "docs" / "internals.md").read_text())
    assert len(hops) >= 15 and hops[0] == "envs/world_model_env.py:WorldModelEnv.step"
    env = tiny_env()
    try:
        trace = trace_env_step(env, np.zeros(env.action_space.shape, env.action_space.dtype))
    finally:
        env.close()
    assert first_in_order(hops, trace.calls) == []
