"""Every refusal names the argument as the user spelled it, through `engine/checks.py` (issue 22)."""

from __future__ import annotations

import pytest
from tiny_world import cache_dir, world  # noqa: F401 - fixtures
from worldstep.engine.checks import check_fps
from worldstep.engine.kv import PageAllocator
from worldstep.envs import PushSimEnv, make_world_model_env


def test_a_refused_action_width_names_action_width(world):  # noqa: F811
    """It used to say only "actions 999 wide do not fit embodiment 'droid_lerobot'"."""
    with pytest.raises(ValueError, match=r"^action_width=999 is invalid: .*'droid_lerobot'.*allowed: action_width=10"):
        make_world_model_env(world.model, world.knobs, embodiment="droid_lerobot", action_width=999)
    with pytest.raises(ValueError, match=r"^action_width='10' is invalid"):
        make_world_model_env(world.model, world.knobs, embodiment="droid_lerobot", action_width="10")


@pytest.mark.parametrize(("call", "pattern"), [
    (lambda: PageAllocator(-1), r"^num_pages=-1 is invalid; allowed: an int >= 0"),
    (lambda: PageAllocator(True), r"^num_pages=True is invalid"),
    (lambda: PageAllocator(4).allocate(-2), r"^n=-2 is invalid"),
    (lambda: PushSimEnv(chunk_size=6), r"^chunk_size=6 is invalid; allowed: an int multiple of 4"),
    (lambda: PushSimEnv(chunk_size=True), r"^chunk_size=True is invalid"),
    (lambda: check_fps("fps", float("inf")), r"^fps=inf is invalid; allowed: a number > 0"),
    (lambda: check_fps("fps", True), r"^fps=True is invalid"),
])
def test_int_and_fps_checks_name_the_argument(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()
