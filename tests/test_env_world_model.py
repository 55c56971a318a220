"""WorldModelEnv: gymnasium's checker, determinism, spaces, infos, bad inputs, close, fork, registration."""

from __future__ import annotations

import dataclasses
import warnings

import gymnasium as gym
import numpy as np
import pytest
import worldstep
from gymnasium.utils.env_checker import check_env
from tiny_world import FAST, cache_dir, ramp, world, zeros  # noqa: F401 - fixtures
from worldstep.engine.models.cosmos3.loader import CheckpointNotFoundError
from worldstep.engine.spec import KVStats, PhaseTimings
from worldstep.envs import JudgeSuccess, WindowLimit, WorldModelEnv, fork_env, make_world_model_env


def counts(model) -> tuple[int, int, int]:
    return model.kv.num_used_pages, model.decoder.live_warm_sessions, model.live_sessions


@pytest.fixture
def env(world):  # noqa: F811
    env = worldstep.make_env(world, max_windows=3)
    yield env
    env.close()


def test_check_env_passes_without_warnings(world):  # noqa: F811
    env = gym.make("worldstep/Tiny-v0", model=world, max_windows=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.close()
    assert counts(world.model) == (0, 0, 0)


def test_gym_make_default_id_builds_the_embedded_model(world):  # noqa: F811
    env = gym.make("worldstep/Tiny-v0", **FAST)  # loading never shares silently: its own model and pool
    assert env.unwrapped.model is not world.model and env.unwrapped.model.spec.name == world.model.spec.name
    shared = [gym.make("worldstep/Tiny-v0", share=True, **FAST) for _ in range(2)]  # sharing is explicit
    assert shared[0].unwrapped.model is shared[1].unwrapped.model is not env.unwrapped.model
    passed = gym.make("worldstep/Tiny-v0", model=world, max_windows=3)  # or pass a World around
    assert passed.unwrapped.model is world.model and passed.get_wrapper_attr("max_windows") == 3
    for other in (*shared, passed):
        other.close()
    assert env.spec.max_episode_steps == worldstep.load_config("tiny").env.max_windows
    obs, info = env.reset(seed=0, options={"prompt": "pick up the red cube", "domain_id": 8})
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    assert obs["frames"].shape == (4, 32, 32, 3)
    env.close()


def test_spaces_and_metadata(env, world):  # noqa: F811
    spec = world.spec
    # tiny.yaml's domain 8 stands for its embodiment, droid_lerobot: exactly 10-wide actions at 15 fps
    assert env.unwrapped.embodiment == "droid_lerobot" and env.unwrapped.domain_id == 8
    assert env.action_space == gym.spaces.Box(-1, 1, (4, 10), np.float32)
    frames = env.observation_space["frames"]
    assert frames.shape == (4, spec.height, spec.width, 3) and frames.dtype == np.uint8
    assert env.metadata["frame_fps"] == 15 and env.metadata["render_fps"] == 15 / 4  # a frame per window
    with pytest.raises(ValueError, match="droid_lerobot.*exactly 10"):
        worldstep.make_env(world, action_width=2)


def test_reset_frames_repeat_the_decoded_first_frame_and_step_infos(env):
    obs, info = env.reset(seed=0)
    assert np.array_equal(obs["frames"], np.repeat(obs["frames"][:1], 4, axis=0))
    assert info["frame_start"] == 0 and info["frame_end"] == 1 and info["kv"].protected_tokens > 0
    obs, reward, terminated, truncated, info = env.step(zeros(env.action_space))
    assert obs in env.observation_space
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert set(info) == {"window_index", "frame_start", "frame_end", "timings", "kv", "is_success", "kv_exhausted"}
    assert (info["window_index"], info["frame_start"], info["frame_end"]) == (0, 1, 5)
    assert isinstance(info["timings"], PhaseTimings) and info["timings"].denoise_s > 0
    assert isinstance(info["kv"], KVStats) and info["kv"].pages_in_use > 0


def test_same_seed_and_actions_give_the_same_frames(env):
    def run(seed):
        obs, _ = env.reset(seed=seed)
        frames = [obs["frames"]]
        for scale in (0.5, -0.3):
            frames.append(env.step(ramp(env.action_space, scale))[0]["frames"])
        return np.concatenate(frames)

    first = run(3)
    assert np.array_equal(first, run(3))
    assert not np.array_equal(first, run(4))


def test_truncation_at_max_windows_and_success_termination(world):  # noqa: F811
    env = worldstep.make_env(world, max_windows=2, success_fn=lambda frames: frames.mean() >= 0,
                             reward_fn=lambda frames, actions: 0.25)
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(zeros(env.action_space))
    assert reward == 0.25 and terminated and info["is_success"] and not truncated
    _, _, _, truncated, _ = env.step(zeros(env.action_space))
    assert truncated
    env.close()


BAD_ACTIONS = [  # the tiny env's actions are droid_lerobot's: (4, 10)
    (np.zeros((3, 10), np.float32), r"actions.shape=\(3, 10\)"),
    (np.zeros((4, 16), np.float32), r"actions.shape=\(4, 16\)"),
    (np.full((4, 10), np.nan, np.float32), "NaN or inf"),
    (np.full((4, 10), 1.5, np.float32), r"\[-1, 1\]"),
    (np.zeros((4, 10), np.complex64), "actions.dtype=complex64"),
    (np.zeros((4, 10), bool), "actions.dtype=bool"),
]


@pytest.mark.parametrize(("actions", "match"), BAD_ACTIONS)
def test_bad_actions_raise_and_env_keeps_working(env, actions, match):
    env.reset(seed=0)
    pages = env.unwrapped.model.kv.num_used_pages
    with pytest.raises(ValueError, match=match):
        env.step(actions)
    assert env.unwrapped.model.kv.num_used_pages == pages and env.unwrapped.windows == 0


BAD_OPTIONS = [
    ({"domain_id": 32}, r"options\['domain_id'\]=32 is invalid; allowed: an int in \[0, 32\)"),
    ({"domain_id": -1}, r"options\['domain_id'\]=-1"),
    ({"domain_id": True}, r"options\['domain_id'\]=True"),
    ({"domain_id": 1.0}, r"options\['domain_id'\]=1.0"),
    ({"prompt": ""}, r"options\['prompt'\]='' is invalid; allowed: a non-empty string"),
    ({"prompt": 3}, r"options\['prompt'\]=3"),
    ({"image": np.full((32, 32, 3), 2.0, np.float32)}, r"options\['image'\] float values in \[2, 2\]"),
    ({"image": np.zeros((32, 32, 3), np.int32)}, r"options\['image'\].dtype=int32"),
    ({"camera": "wrist"}, r"options\['camera'\] is invalid; allowed keys: image, prompt, domain_id"),
    ({"image": np.zeros((32, 32), np.uint8)}, r"options\['image'\].shape=\(32, 32\)"),
    ({"image": [[0]]}, r"options\['image'\] of type list"),
]


@pytest.mark.parametrize(("options", "match"), BAD_OPTIONS)
def test_bad_reset_options_raise_and_episode_continues(env, options, match):
    env.reset(seed=0)
    env.step(zeros(env.action_space))
    with pytest.raises(ValueError, match=match):
        env.reset(seed=1, options=options)
    _, _, _, _, info = env.step(zeros(env.action_space))  # the episode is untouched
    assert info["window_index"] == 1


def test_reset_options_image_of_any_size_and_none_values(env, world):  # noqa: F811
    image = np.full((48, 40, 3), 200, np.uint8)  # any size: the engine resizes
    obs, _ = env.reset(seed=0, options={"image": image, "prompt": None})  # None: the default prompt
    assert obs["frames"].shape[1:3] == (world.spec.height, world.spec.width)
    floats, _ = env.reset(seed=0, options={"image": image / 255.0})  # or float in [0, 1]
    np.testing.assert_array_equal(floats["frames"], obs["frames"])


def test_step_before_reset(world):  # noqa: F811
    env = worldstep.make_env(world)
    with pytest.raises(gym.error.ResetNeeded):
        env.step(zeros(env.action_space))


def test_bad_constructor_arguments(world):  # noqa: F811
    env = WorldModelEnv(world.model, world.knobs, embodiment=8)
    with pytest.raises(ValueError, match="max_windows=0"):
        WindowLimit(env, 0)
    with pytest.raises(ValueError, match="max_windows=0"):
        make_world_model_env(world.model, world.knobs, max_windows=0, domain_id=8)
    with pytest.raises(ValueError, match=r"^action_width=17 is invalid: .*'droid_lerobot'"):
        make_world_model_env(world.model, world.knobs, domain_id=8, action_width=17)
    with pytest.raises(ValueError, match="render_mode='human'"):
        WorldModelEnv(world.model, world.knobs, embodiment=8, render_mode="human")
    with pytest.raises(TypeError, match="success_fn"):
        JudgeSuccess(env, success_fn=3)
    with pytest.raises(TypeError, match="success_fn"):
        make_world_model_env(world.model, world.knobs, domain_id=8, success_fn=3)
    # neither an embodiment nor a domain: the tiny checkpoint registers many, so none is a default
    with pytest.raises(ValueError, match=r"embodiment=None and domain_id=None: give one; allowed names: .*droid"):
        WorldModelEnv(world.model, world.knobs)
    # a domain without an embodiment (10), and one whose embodiments differ in width (5: libero)
    for domain in (10, 5):
        with pytest.raises(ValueError, match=f"embodiment={domain}|{domain}"):
            WorldModelEnv(world.model, world.knobs, embodiment=domain)
        with pytest.raises(ValueError, match=f"domain_id={domain}|{domain}"):
            make_world_model_env(world.model, world.knobs, domain_id=domain)
    with pytest.raises(TypeError, match="model"):
        WorldModelEnv("tiny")
    env.close()


def test_constructor_takes_a_checked_conditioning(world):  # noqa: F811
    model, knobs = world.model, world.knobs
    cond = model.conditioning(knobs, env_rule=True, embodiment="droid_lerobot", fps=5.0)
    env = WorldModelEnv(model, knobs, embodiment=cond)
    assert (env.conditioning, env.metadata["frame_fps"], env.action_space.shape) == (cond, 5.0, (4, 10))
    raw = model.conditioning(knobs, domain_id=10)  # a raw domain: no embodiment to hold the env to
    with pytest.raises(ValueError, match=r"embodiment=Conditioning\(.*names no embodiment"):
        WorldModelEnv(model, knobs, embodiment=raw)
    other = dataclasses.replace(cond, view_point="not_the_knobs_view")  # not what these knobs resolve
    with pytest.raises(ValueError, match=r"embodiment=Conditioning\(.* is invalid for this model and knobs"):
        WorldModelEnv(model, knobs, embodiment=other)


def test_render_returns_the_latest_frame(world):  # noqa: F811
    env = worldstep.make_env(world, render_mode="rgb_array")
    obs, _ = env.reset(seed=0)
    assert np.array_equal(env.render(), obs["frames"][-1])
    obs, *_ = env.step(zeros(env.action_space))
    assert np.array_equal(env.render(), obs["frames"][-1])
    env.close()


def test_close_is_idempotent_and_returns_every_page(world):  # noqa: F811
    model = world.model
    assert counts(model) == (0, 0, 0)
    env = worldstep.make_env(world)
    env.reset(seed=0)
    env.step(zeros(env.action_space))
    assert model.kv.num_used_pages > 0 and model.decoder.live_warm_sessions == 1
    env.reset(seed=1)  # a reset closes the previous session
    assert model.live_sessions == 1
    env.close()
    env.close()
    assert counts(model) == (0, 0, 0)


def test_fork_continues_independently(world):  # noqa: F811
    env = worldstep.make_env(world)
    ref = worldstep.make_env(world)
    a0, a1, b1 = ramp(env.action_space, 0.3), ramp(env.action_space, -0.6), ramp(env.action_space, 0.9)
    for e in (env, ref):
        e.reset(seed=5)
        e.step(a0)
    twin = fork_env(env)
    other = fork_env(env, seed=123)
    assert twin.unwrapped.windows == env.unwrapped.windows == 1
    assert twin.get_wrapper_attr("elapsed_windows") == 1  # the window limit's count goes with the fork
    other.step(b1)  # a different future on the fork leaves the original untouched
    obs_env = env.step(a1)[0]
    obs_twin = twin.step(a1)[0]
    obs_ref = ref.step(a1)[0]
    assert np.array_equal(obs_env["frames"], obs_ref["frames"])
    assert np.array_equal(obs_twin["frames"], obs_env["frames"])  # RNG copied: the same future
    for e in (twin, other, env, ref):
        e.close()
    assert counts(world.model) == (0, 0, 0)
    with pytest.raises(gym.error.ResetNeeded):
        env.unwrapped.fork()


def test_running_out_of_pages_is_truncation(world):  # noqa: F811
    pages = world.model.min_pages(world.config.env.prompt, world.knobs)  # the prompt and first window fit
    small = worldstep.load(world.config, num_pages=pages, context_frames=0)
    env = worldstep.make_env(small, max_windows=50)
    env.reset(seed=0)
    for _ in range(50):
        obs, reward, terminated, truncated, info = env.step(zeros(env.action_space))
        if truncated:
            break
    assert truncated and not terminated and info["kv_exhausted"] and reward == 0.0
    assert obs in env.observation_space
    assert small.model.kv.num_used_pages == 0  # the session was closed, its pages returned
    with pytest.raises(gym.error.ResetNeeded):
        env.step(zeros(env.action_space))
    env.reset(seed=0)  # and the env is usable again
    env.close()


def test_cosmos3_edge_names_the_missing_checkpoint(tmp_path):
    missing = tmp_path / "no-weights-here"
    with pytest.raises(CheckpointNotFoundError, match="no-weights-here"):
        gym.make("worldstep/Cosmos3Edge-v0", checkpoint=str(missing))
    max_windows = worldstep.load_config("cosmos3_edge").env.max_windows
    assert gym.spec("worldstep/Cosmos3Edge-v0").max_episode_steps == max_windows
