"""Trace one ``env.step`` of ``worldstep/Tiny-v0`` and count the worldstep code it runs.

    python tests/perf/trace_step.py [--json out.json] [--list] [--kinds]

Counts, with ``sys.setprofile``, the distinct worldstep functions called while one ``env.step`` runs (the env
is reset and stepped once first, so nothing is built lazily inside the traced step), the distinct files they
live in, and the deepest chain of nested worldstep frames under ``env.step`` (``env.step`` itself is depth 1).
Calls into torch, diffusers, numpy or gymnasium are not counted, nor what they call back. `test_internals_doc`
uses `trace_env_step` to check that the functions `docs/internals.md` names are on the path, in its order.
``--kinds`` breaks the count down by where the functions live and what they are: comprehensions (not a
``def``), properties, checks (a name starting ``check`` or ``_check``, and ``is_int``: they only validate), and
the rest. ``--forwarders`` lists the functions on the path that only hand their arguments on (`forwards`): a
layer a reader must cross that does no work of its own (`tests/test_step_path.py` keeps the path free of them).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import functools
import importlib
import inspect
import json
import sys
from collections import Counter
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
    codes: dict[str, object] = field(default_factory=dict)  # "path:qualname" -> its code object
    modules: dict[str, str] = field(default_factory=dict)  # "path:qualname" -> the module it is defined in
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

    def kind(self, call: str) -> str:
        """``comprehension``, ``property``, ``check`` or ``work`` (see the module docstring)."""
        qualname = call.split(":")[1]
        name = qualname.rsplit(".", 1)[-1]
        if qualname.endswith(INLINE):
            return "comprehension"
        if name.startswith(("check", "_check")) or name == "is_int":
            return "check"
        owner, _, attr = qualname.rpartition(".")
        if owner and "<locals>" not in owner:
            cls = getattr(importlib.import_module(self.modules[call]), owner.split(".")[0], None)
            for part in owner.split(".")[1:]:
                cls = getattr(cls, part, None)
            if cls is not None and isinstance(inspect.getattr_static(cls, attr, None), property):
                return "property"
        return "work"

    def kinds(self) -> dict[str, Counter]:
        """Per folder (``engine/kv/``, ``envs/``, ...): how many functions of each kind."""
        table: dict[str, Counter] = {}
        for call in self.calls:
            folder = call.split(":")[0].rsplit("/", 1)[0] + "/"
            table.setdefault(folder, Counter())[self.kind(call)] += 1
        return table

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
                trace.modules[name] = frame.f_globals.get("__name__", "")
                trace.codes[name] = frame.f_code
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


def _plain(node: ast.expr) -> bool:
    """An argument passed on as it came: a name, an attribute chain, a constant or ``*args``/``**kwargs``."""
    return all(isinstance(n, (ast.Name, ast.Attribute, ast.Constant, ast.Starred, ast.Load)) for n in ast.walk(node))


@functools.cache
def _defs(filename: str) -> dict[int, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every ``def`` of a file by its first line (its first decorator's, as its code object counts it)."""
    nodes = (n for n in ast.walk(ast.parse(Path(filename).read_text()))
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return {min([n.lineno, *(d.lineno for d in n.decorator_list)]): n for n in nodes}


def forwards(code) -> str | None:
    """The statement, when the function of ``code`` (a module- or class-level ``def``) only hands its arguments
    on: its body, past the docstring, is one call of another function (returned or not, under at most one
    ``with``, as a lock-and-delegate facade) of a function named by a name or attribute chain, with arguments
    that are names, attributes or constants. None else."""
    if "<locals>" in code.co_qualname or code.co_qualname.endswith(INLINE):
        return None  # closures (a decorator's wrapper) and comprehensions: not a layer of their own
    node = _defs(code.co_filename).get(code.co_firstlineno)
    if node is None:
        return None
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    if len(body) == 1 and isinstance(body[0], (ast.With, ast.AsyncWith)):
        body = body[0].body
    if len(body) != 1 or not isinstance(body[0], (ast.Return, ast.Expr)) or not isinstance(body[0].value, ast.Call):
        return None
    call = body[0].value
    is_builtin = isinstance(call.func, ast.Name) and hasattr(builtins, call.func.id)
    if is_builtin or not all(_plain(a) for a in [call.func, *call.args, *(k.value for k in call.keywords)]):
        return None
    return ast.unparse(body[0])


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
    parser.add_argument("--kinds", action="store_true", help="count the functions by folder and kind")
    parser.add_argument("--forwarders", action="store_true", help="list the functions that only hand arguments on")
    args = parser.parse_args(argv)
    import numpy as np

    env = tiny_env()
    trace = trace_env_step(env, np.zeros(env.action_space.shape, env.action_space.dtype))
    env.close()
    if args.list:
        print("\n".join(f"{call}  [{trace.kind(call)}]" for call in trace.calls))
    if args.kinds:
        kinds = ("work", "check", "property", "comprehension")
        table = trace.kinds()
        print(f"{'folder':28}" + "".join(f"{k:>15}" for k in kinds) + f"{'all':>8}")
        for folder, counts in sorted(table.items(), key=lambda item: -sum(item[1].values())):
            print(f"{folder:28}" + "".join(f"{counts[k]:>15}" for k in kinds) + f"{sum(counts.values()):>8}")
        total = sum(table.values(), Counter())
        print(f"{'all':28}" + "".join(f"{total[k]:>15}" for k in kinds) + f"{sum(total.values()):>8}")
    if args.forwarders:
        found = {call: forwards(code) for call, code in trace.codes.items()}
        print("\n".join(f"{call}: {stmt}" for call, stmt in found.items() if stmt) or "no forwarders on the path")
    print(f"one env.step on worldstep/Tiny-v0: {trace.functions} functions ({trace.named_functions} named with "
          f"def) in {len(trace.files)} files, {trace.depth} frames deep")
    print("deepest chain: " + " -> ".join(n.split(":")[1] for n in trace.chain))
    if args.json:
        args.json.write_text(json.dumps(trace.to_dict(), indent=2) + "\n")


if __name__ == "__main__":
    main()
