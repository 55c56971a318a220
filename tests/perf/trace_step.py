"""Trace one ``env.step`` of ``worldstep/Tiny-v0`` and count the worldstep code it runs.

    python tests/perf/trace_step.py [--json out.json] [--list]

Counts, with ``sys.setprofile``, the distinct worldstep functions called while one ``env.step`` runs (the env
is reset and stepped once first, so nothing is built lazily inside the traced step), the distinct files they
live in, and the deepest chain of nested worldstep frames under ``env.step`` (``env.step`` itself is depth 1).
Calls into torch, diffusers, numpy or gymnasium are not counted, nor what they call back. `test_internals_doc`
uses `trace_env_step` to check that the functions `docs/internals.md` names are on the path, in its order.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

INLINE = ("<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>", "<lambda>")  # code objects that are not a def


def _folders() -> dict[str, str]:
    """Where the imported worldstep packages live (this tree, or another one on PYTHONPATH), by short name."""
    import worldstep
    import worldstep.engine
    import worldstep.envs

    return {str(Path(m.__file__).parent) + "/": short for m, short in
            ((worldstep.envs, "envs/"), (worldstep.engine, "engine/"), (worldstep, "sdk/"))}


@dataclass
class StepTrace:
    """Worldstep functions one step ran, in first-call order, and the deepest chain of them."""

    calls: list[str] = field(default_factory=list)  # "path:qualname" in first-call order
    files: set[str] = field(default_factory=set)
    depth: int = 0
    chain: list[str] = field(default_factory=list)  # the deepest chain, outermost first

    @property
    def functions(self) -> int:
        return len(self.calls)

    @property
    def named_functions(self) -> int:
        """Functions defined with ``def`` (comprehensions, generator expressions and lambdas left out)."""
        return sum(not n.endswith(INLINE) for n in self.calls)

    def to_dict(self) -> dict:
        return {"functions": self.functions, "named_functions": self.named_functions, "files": len(self.files),
                "depth": self.depth, "chain": self.chain}


def trace_env_step(env, action) -> StepTrace:
    """One ``env.step(action)`` under the profiler."""
    trace, seen, stack = StepTrace(), set(), []
    folders = _folders()
    names: dict = {}  # code object -> "folder/file.py:qualname", or None when not worldstep code

    def name_of(code) -> str | None:
        if code not in names:
            names[code] = next((f"{short}{code.co_filename[len(path):]}:{code.co_qualname}"
                                for path, short in folders.items() if code.co_filename.startswith(path)), None)
        return names[code]

    def profile(frame, event, arg) -> None:
        if event not in ("call", "return") or name_of(frame.f_code) is None:
            return
        if event == "call":
            stack.append(name_of(frame.f_code))
            name = stack[-1]
            if name not in seen:
                seen.add(name)
                trace.calls.append(name)
                trace.files.add(name.split(":")[0])
            if len(stack) > trace.depth:
                trace.depth, trace.chain = len(stack), list(stack)
        elif stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        env.step(action)
    finally:
        sys.setprofile(None)
    return trace


def tiny_env():
    """``worldstep/Tiny-v0``, reset and stepped once (so lazy builds are not traced)."""
    import gymnasium as gym
    import numpy as np
    import worldstep  # noqa: F401 (registers the ids)

    env = gym.make("worldstep/Tiny-v0")
    env.reset(seed=0)
    env.step(np.zeros(env.action_space.shape, env.action_space.dtype))
    return env


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the counts here")
    parser.add_argument("--list", action="store_true", help="print every function, in first-call order")
    args = parser.parse_args(argv)
    import numpy as np

    env = tiny_env()
    trace = trace_env_step(env, np.zeros(env.action_space.shape, env.action_space.dtype))
    env.close()
    if args.list:
        print("\n".join(trace.calls))
    print(f"one env.step on worldstep/Tiny-v0: {trace.functions} functions ({trace.named_functions} named with "
          f"def) in {len(trace.files)} files, {trace.depth} frames deep")
    print("deepest chain: " + " -> ".join(n.split(":")[1] for n in trace.chain))
    if args.json:
        args.json.write_text(json.dumps(trace.to_dict(), indent=2) + "\n")


if __name__ == "__main__":
    main()
