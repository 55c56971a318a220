"""worldstep.trust's inverse-dynamics consistency plug-in: ~0 where the frames show the commanded actions, growing
as the commanded actions depart from the ones the frames came from, None without inverse dynamics, and the
Cosmos3 model's own inverse dynamics (checked against diffusers in tests/test_cosmos3_inverse_dynamics.py)."""

from __future__ import annotations

import dataclasses
import types

import gymnasium as gym
import numpy as np
import pytest
import torch
import worldstep
from worldstep.engine.models.cosmos3.inverse_dynamics import encode_clip, infer_actions
from worldstep.engine.models.cosmos3.prompt import tokenize_action_prompt
from worldstep.envs.push_sim import SPEED, PushSimEnv, detect_objects
from worldstep.trust import CosmosInverseDynamics, InverseDynamicsTracker, TrustSignalsWrapper


def effector_inverse_dynamics(clip: np.ndarray) -> np.ndarray:
    """PushSim's exact inverse dynamics away from walls and the block: the effector moves `SPEED * action` a frame."""
    effectors = np.array([detect_objects(frame)["effector"] for frame in clip], dtype=np.float64)  # [chunk + 1, 2]
    return np.diff(effectors, axis=0) / SPEED


class MappedActions(gym.ActionWrapper):
    """The env below is stepped with `fn(action)`: e.g. other actions than the commanded ones (a model that ignores
    its actions), or raw actions normalised (`NormalizeActions`)."""

    def __init__(self, env: gym.Env, fn) -> None:
        super().__init__(env)
        self.fn = fn

    def action(self, action):
        return self.fn(action)


def _consistency(env: gym.Env, commanded: np.ndarray, windows: int = 2) -> list[float]:
    env.reset(seed=1)
    return [env.step(commanded)[4]["trust"].consistency for _ in range(windows)]


# small moves in the middle of the table: no wall and no block in the effector's way for two windows
COMMANDED = np.array([[0.5, 0.0], [0.5, 0.5], [0.0, 0.5], [-0.5, 0.5]], dtype=np.float32)


def test_consistency_is_near_zero_when_the_frames_show_the_commanded_actions():
    tracker = InverseDynamicsTracker(effector_inverse_dynamics)
    signal = _consistency(TrustSignalsWrapper(PushSimEnv(chunk_size=4), tracker=tracker), COMMANDED)
    assert max(signal) < 0.15, signal  # detection rounds the effector to ~0.5 px of a 1.5 px move


@pytest.mark.parametrize("other, low", [(-COMMANDED, 0.3), (np.zeros_like(COMMANDED), 0.15)])
def test_consistency_grows_when_the_frames_came_from_other_actions(other, low):
    tracker = InverseDynamicsTracker(effector_inverse_dynamics)
    env = TrustSignalsWrapper(MappedActions(PushSimEnv(chunk_size=4), lambda a: other), tracker=tracker)
    signal = _consistency(env, COMMANDED)
    assert min(signal) > low, signal
    expected = np.mean(np.abs(COMMANDED - other))  # the gap between the commanded actions and the shown ones
    assert abs(np.mean(signal) - expected) < 0.15, (signal, expected)


def test_normalize_maps_the_commanded_actions_first():
    """Raw actions (twice the normalised ones) step the wrapper; the env below sees them normalised."""
    halve = lambda a: np.asarray(a) / 2  # noqa: E731
    env = MappedActions(PushSimEnv(chunk_size=4), halve)
    assert max(_consistency(TrustSignalsWrapper(env, tracker=InverseDynamicsTracker(
        effector_inverse_dynamics, normalize=halve)), 2 * COMMANDED)) < 0.15
    assert min(_consistency(TrustSignalsWrapper(env, tracker=InverseDynamicsTracker(
        effector_inverse_dynamics)), 2 * COMMANDED)) > 0.3  # compared raw, the same frames look inconsistent


def test_absent_when_the_inverse_model_cannot_tell():
    env = TrustSignalsWrapper(PushSimEnv(chunk_size=4), tracker=InverseDynamicsTracker(lambda clip: None))
    assert _consistency(env, COMMANDED) == [None, None]


@pytest.fixture(scope="module")
def pusher():
    env = worldstep.make_env("pusher", num_steps=1, max_windows=4)
    yield env
    env.close()


def test_cosmos_plugin_reports_the_models_own_inverse_dynamics(pusher):
    """On the pusher, the signal is mean |inferred - commanded| with the engine's inverse dynamics of the window's
    frames, repeatable, and absent (None) once the checkpoint has no action head."""
    inverse = CosmosInverseDynamics.of_env(pusher, num_steps=2, seed=5)
    assert inverse.available and inverse.query.action_width == 2 and inverse.caption_size == (64, 64)
    env = TrustSignalsWrapper(pusher, tracker=InverseDynamicsTracker(inverse))
    obs, _ = env.reset(seed=1)
    previous = obs["frames"][-1]
    obs, *_, info = env.step(COMMANDED)
    clip = np.concatenate([previous[None], obs["frames"]])
    components = pusher.unwrapped.model.components
    ids = tokenize_action_prompt(components.tokenizer, pusher.unwrapped.prompt, pusher.unwrapped.knobs.negative_prompt,
                                 view_point="ego_view", num_frames=5, fps=24.0, height=64, width=64)
    latents = encode_clip(components.vae, torch.from_numpy(clip / 127.5 - 1.0).float().permute(3, 0, 1, 2)[None])
    inferred = infer_actions(components, latents, ids, inverse.query, chunk_size=4, num_steps=2,
                             generator=torch.Generator().manual_seed(5)).numpy()
    consistency = info["trust"].consistency
    assert consistency == pytest.approx(float(np.mean(np.abs(inferred - COMMANDED))), rel=1e-5)
    assert consistency > 0  # an untrained inverse head does not land on the commanded actions
    assert InverseDynamicsTracker(inverse).residual(previous, obs["frames"], COMMANDED) == consistency  # repeatable
    assert InverseDynamicsTracker(inverse).residual(previous, obs["frames"], -COMMANDED) != consistency

    headless = dataclasses.replace(inverse, components=types.SimpleNamespace(
        transformer=types.SimpleNamespace(config=types.SimpleNamespace(action_gen=False))))
    assert not headless.available
    env = TrustSignalsWrapper(pusher, tracker=InverseDynamicsTracker(headless))
    env.reset(seed=1)
    assert env.step(COMMANDED)[4]["trust"].consistency is None


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_steps=0), "num_steps=0"),
    (dict(guidance_scale=0.5), "guidance_scale=0.5"),
    (dict(seed=-1), "seed=-1"),
])
def test_bad_plugin_arguments_name_the_argument(pusher, kwargs, match):
    with pytest.raises(ValueError, match=match):
        InverseDynamicsTracker.for_env(pusher, **kwargs)


def test_bad_tracker_arguments_name_the_argument():
    with pytest.raises(ValueError, match="inverse=3"):
        InverseDynamicsTracker(3)
    with pytest.raises(ValueError, match="normalize=5"):
        InverseDynamicsTracker(effector_inverse_dynamics, normalize=5)
    with pytest.raises(ValueError, match="env="):
        CosmosInverseDynamics.of_env(PushSimEnv(chunk_size=4))
    with pytest.raises(TypeError):
        InverseDynamicsTracker.for_env(PushSimEnv(chunk_size=4), guidance=2.0)
    frames = PushSimEnv(chunk_size=4).reset(seed=0)[0]["frames"]
    with pytest.raises(ValueError, match=r"actions of shape \(4, 3\)"):
        InverseDynamicsTracker(effector_inverse_dynamics).residual(frames[-1], frames, np.zeros((4, 3)))
