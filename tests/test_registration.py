"""The gymnasium ids are registered one way, by ``import worldstep``, in either import order (fresh interpreters)."""

from __future__ import annotations

import subprocess
import sys

import pytest

IDS = ("worldstep/Tiny-v0", "worldstep/Pusher-v0", "worldstep/PushSim-v0", "worldstep/Remote-v0")

MAKE = f"""
ids = {IDS!r}
assert all(i in gym.registry for i in ids), [i for i in ids if i not in gym.registry]
env = gym.make("worldstep/PushSim-v0")
obs, _ = env.reset(seed=0)
assert obs["frames"].shape == (4, 64, 64, 3)
assert not any(type(f).__name__ == "_AfterGymnasiumImport" for f in sys.meta_path), "the hook stayed"
"""

ORDERS = {
    "gymnasium first": "import sys\nimport gymnasium as gym\nimport worldstep\n",
    "worldstep first": ("import sys\nimport worldstep\nassert 'gymnasium' not in sys.modules\n"
                        "import gymnasium as gym\n"),
    # torchrl and others look gymnasium up without loading it: nothing registers, and the hook waits
    "looked up, then loaded": ("import importlib.util, sys\nimport worldstep.engine\n"
                               "assert importlib.util.find_spec('gymnasium') is not None\n"
                               "assert 'gymnasium' not in sys.modules\nimport gymnasium as gym\n"),
}


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("order", ORDERS)
def test_gym_make_finds_the_ids_in_either_import_order(order):
    done = _run(ORDERS[order] + MAKE)
    assert done.returncode == 0, done.stderr


def test_gymnasium_alone_registers_nothing_of_worldstep():
    """Gymnasium 1.x loads no plugin entry points: without ``import worldstep`` the ids are unknown. (Were this to
    fail, gymnasium reads entry points again, and the import hook of ``worldstep.registration`` could go.)"""
    done = _run("import sys\nimport gymnasium as gym\n"
                "assert 'worldstep' not in sys.modules and 'worldstep/Tiny-v0' not in gym.registry\n")
    assert done.returncode == 0, done.stderr


def test_the_order_test_fails_without_the_hook():
    """The "worldstep first" order, with the hook taken out before gymnasium loads: the ids are missing."""
    without = ORDERS["worldstep first"].replace(
        "import gymnasium as gym\n",
        "sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != '_AfterGymnasiumImport']\n"
        "import gymnasium as gym\n")
    done = _run(without + MAKE)
    assert done.returncode != 0 and "AssertionError: ['worldstep/Tiny-v0'" in done.stderr, done.stderr
