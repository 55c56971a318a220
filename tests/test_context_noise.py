"""The context_noise knob: committed windows noised at a level the model sees as their timestep; off is exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from worldstep.engine.config import RolloutKnobs
from worldstep.engine.models.cosmos3.checkpoint import build_checkpoint
from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel
from worldstep.engine.settings import ConfigError


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from worldstep.train.pusher import architectures

    t_arch, v_arch = architectures(small=True)
    t_arch = {k: v for k, v in t_arch.items() if k != "dtype"}
    path = build_checkpoint(tmp_path_factory.mktemp("ckpt") / "c", {"transformer": t_arch, "vae": v_arch,
                                                                     "height": 64, "width": 64, "fps": 24}, seed=3)
    model = Cosmos3WorldModel.from_pretrained(path, device="cpu", page_size=4, num_pages=1024)
    yield model
    model.close_all()


def _rollout(world, knobs_list, windows=3):
    image = np.full((64, 64, 3), 90, np.uint8)
    sessions = [world.open_session(image, "push", 0, knobs=k, generator=torch.Generator().manual_seed(7),
                                   action_width=2) for k in knobs_list]
    actions = np.random.default_rng(1).uniform(-1, 1, (windows, 4, 2)).astype(np.float32)
    out = [[] for _ in sessions]
    try:
        for w in range(windows):
            for i, r in enumerate(world.step(sessions, [actions[w]] * len(sessions))):
                out[i].append(r.latents)
    finally:
        for s in sessions:
            world.close(s)
    return [torch.cat(o, dim=1) for o in out]


def test_off_is_the_clean_commit_bit_for_bit_and_a_level_changes_only_later_windows(world):
    default, zero, noised = _rollout(world, [RolloutKnobs(num_steps=2), RolloutKnobs(num_steps=2, context_noise=0.0),
                                             RolloutKnobs(num_steps=2, context_noise=0.2)])
    assert torch.equal(default, zero)
    assert torch.equal(noised[:, :1], default[:, :1])  # window 0 runs before any commit
    assert not torch.allclose(noised[:, 1:], default[:, 1:], atol=1e-4)  # later windows see the noised context
    assert world.kv.num_used_pages == 0


def test_sessions_of_other_levels_never_share_a_window(world):
    image = np.full((64, 64, 3), 90, np.uint8)
    a, b = (world.open_session(image, "push", 0, knobs=RolloutKnobs(context_noise=level), action_width=2)
            for level in (0.0, 0.1))
    try:
        assert a.group_key(a.plan) != b.group_key(b.plan)
    finally:
        world.close(a)
        world.close(b)


def test_the_knob_is_checked():
    with pytest.raises((ValueError, ConfigError), match="context_noise"):
        RolloutKnobs(context_noise=1.0)
    with pytest.raises((ValueError, ConfigError), match="context_noise"):
        RolloutKnobs(context_noise=0.1, window_mode="chained")
