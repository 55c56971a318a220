"""`docs/internals.md` matches the code: one traced `env.step` of worldstep/Tiny-v0 runs every function the data
path names, in the doc's order; the wrapper stacks it lists are the ones built; the vector env takes the autoreset
modes it names."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import worldstep
from gymnasium.vector import AutoresetMode
from tiny_world import cache_dir, world  # noqa: F401 - fixtures
from worldstep.engine.embodiment.action_normalizer import ActionNormalizer
from worldstep.world import make_vec_env

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "tests" / "perf"))
from trace_step import tiny_env, trace_env_step  # noqa: E402

HOP = re.compile(r"^\d+\. `([\w.]+)` \(`([\w/.]+)`\)", re.MULTILINE)
STACK = re.compile(r"^- `(.+?)`(?:, each of its `envs`)?: (`\w+`(?: > `\w+`)*)$", re.MULTILINE)
TINY = "worldstep/Tiny-v0"


def section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


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
    assert len(hops) >= 15 and hops[:2] == ["envs/wrappers/episode.py:SplitStep.step",
                                            "envs/world_model_env.py:WorldModelEnv.step_live"]
    env = tiny_env()
    try:
        trace = trace_env_step(env, np.zeros(env.action_space.shape, env.action_space.dtype))
    finally:
        env.close()
    assert first_in_order(hops, trace.calls) == []


def doc_stacks(text: str) -> dict[str, list[str]]:
    """Each build the wrapper-frames section lists, with its classes outermost first."""
    return {build: re.findall(r"`(\w+)`", chain) for build, chain in STACK.findall(section(text, "The wrapper frames"))}


def chain(env) -> list[str]:
    """The class names of ``env``'s wrappers, outermost first, down to the env."""
    names = [type(env).__name__]
    while isinstance(env, gym.Wrapper):
        env = env.env
        names.append(type(env).__name__)
    return names


def test_the_wrapper_frames_are_the_ones_built(world):  # noqa: F811
    """Each stack the doc lists, built on the loaded tiny model (``model=world``: the tiny config with smaller
    frames; its ``env.max_windows`` is the registered one, as for a plain ``gym.make``)."""
    builds = {
        f'gym.make("{TINY}")': lambda: gym.make(TINY, model=world),
        f'gym.make("{TINY}", max_windows=4)': lambda: gym.make(TINY, model=world, max_windows=4),
        f'gym.make("{TINY}", disable_env_checker=True)': lambda: gym.make(TINY, model=world,
                                                                          disable_env_checker=True),
        'worldstep.make_env("tiny")': lambda: worldstep.make_env(world),
        'worldstep.make_env("tiny", action_normalizer=ActionNormalizer("none"))':
            lambda: worldstep.make_env(world, action_normalizer=ActionNormalizer("none")),
        'worldstep.make_env("tiny", robot_state=True, cameras=("exterior", "wrist"))':
            lambda: worldstep.make_env(world, robot_state=True, cameras=("exterior", "wrist")),
    }
    stacks = doc_stacks((ROOT / "docs" / "internals.md").read_text())
    vec_build = f'gym.make_vec("{TINY}", num_envs=2)'
    assert set(stacks) == {*builds, vec_build}
    for build, make in builds.items():
        env = make()
        try:
            assert chain(env) == stacks[build], build
        finally:
            env.close()
    vec = gym.make_vec(TINY, num_envs=2, model=world)
    try:
        assert chain(vec) == ["WorldModelVectorEnv"]
        assert [chain(sub) for sub in vec.envs] == [stacks[vec_build]] * 2
    finally:
        vec.close()


def test_the_vector_env_takes_the_three_autoreset_modes_the_doc_names(world):  # noqa: F811
    text = section((ROOT / "docs" / "internals.md").read_text(), "The vector env and its three autoreset modes")
    assert re.findall(r"^- `(\w+)`", text, re.MULTILINE) == [m.name for m in AutoresetMode]
    assert gym.make_vec(TINY, num_envs=1, model=world).autoreset_mode is AutoresetMode.NEXT_STEP
    for mode in AutoresetMode:
        for spelled in (mode, mode.value, mode.name.lower()):
            envs = make_vec_env(world, num_envs=1, autoreset_mode=spelled)
            assert envs.autoreset_mode is mode and envs.metadata["autoreset_mode"] is mode
            envs.close()
    envs = gym.make_vec(TINY, num_envs=1, model=world, autoreset_mode="same_step")
    assert envs.autoreset_mode is AutoresetMode.SAME_STEP
    envs.close()
