"""The env's edges a user runs into: closing from another thread, stepping a closed env, a page pool too small
for one episode, misspelt reset options, the success judge a simulator brings, one representation for infos,
render_fps that matches what render() returns, and forking through gym.make's wrappers."""

from __future__ import annotations

import pickle
import threading

import gymnasium as gym
import numpy as np
import pytest
import worldstep
from gymnasium.envs.registration import register, registry
from tiny_world import FAST, cache_dir, world, zeros  # noqa: F401 - fixtures
from worldstep.engine.spec import KVStats, PhaseTimings
from worldstep.envs import RecordRollout, WindowLimit, WorldModelEnv, WorldModelVectorEnv, fork_env


def counts(model) -> tuple[int, int, int]:
    return model.kv.num_used_pages, model.decoder.live_warm_sessions, model.live_sessions


# --- close() from another thread, and after close ----------------------------------------------------


@pytest.mark.parametrize("through", ["the env", "its wrappers"])
def test_close_between_the_check_and_the_engine_call_is_a_clean_error(world, monkeypatch, through):  # noqa: F811
    env = worldstep.make_env(world)
    env.reset(seed=0)
    base = env.unwrapped
    live = base.live_episode

    def live_then_close():  # another thread's close() lands right after step() took its episode
        episode = live()
        env.close()
        return episode

    monkeypatch.setattr(base, "live_episode", live_then_close)
    stepped = base if through == "the env" else env  # the outermost wrapper's one read is the episode stepped
    with pytest.raises(gym.error.ClosedEnvironmentError, match="closed"):
        stepped.step(zeros(env.action_space))
    assert counts(world.model) == (0, 0, 0)


def test_vector_env_close_between_the_check_and_the_batched_call(world, monkeypatch):  # noqa: F811
    vec = worldstep.world.make_vec_env(world, num_envs=2)
    vec.reset(seed=0)
    sub = vec.envs[1].unwrapped
    live = sub.live_episode

    def live_then_close():
        episode = live()
        sub.close()
        return episode

    monkeypatch.setattr(sub, "live_episode", live_then_close)
    with pytest.raises(gym.error.ClosedEnvironmentError):
        vec.step(np.zeros(vec.action_space.shape, np.float32))
    vec.close()
    assert counts(world.model) == (0, 0, 0)


def test_close_from_another_thread_while_stepping(world):  # noqa: F811
    env = worldstep.make_env(world, max_windows=1000)
    env.reset(seed=0)
    errors: list[BaseException] = []
    started = threading.Event()

    def stepper():
        try:
            for _ in range(1000):
                env.step(zeros(env.action_space))
                started.set()
        except BaseException as err:  # noqa: BLE001 - the test inspects what was raised
            errors.append(err)
        finally:
            started.set()

    thread = threading.Thread(target=stepper)
    thread.start()
    started.wait(timeout=120)
    env.close()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], gym.error.ClosedEnvironmentError), errors
    assert counts(world.model) == (0, 0, 0)


def test_step_after_close_says_closed_and_reset_reopens(world):  # noqa: F811
    env = worldstep.make_env(world)
    env.reset(seed=0)
    env.close()
    with pytest.raises(gym.error.ClosedEnvironmentError, match=r"after env.close\(\)"):
        env.step(zeros(env.action_space))
    env.reset(seed=0)
    env.step(zeros(env.action_space))
    env.close()
    assert counts(world.model) == (0, 0, 0)


# --- a pool too small, misspelt options ---------------------------------------------------------------


def test_a_pool_smaller_than_one_episode_is_refused_at_construction(world):  # noqa: F811
    needed = world.model.min_pages(world.config.env.prompt, world.knobs)
    small = worldstep.load(world.config, num_pages=needed - 1)
    with pytest.raises(ValueError, match=rf"cache.num_pages={needed - 1} is invalid .*allowed: >= {needed}"):
        worldstep.make_env(small)
    enough = worldstep.make_env(worldstep.load(world.config, num_pages=needed))  # the minimum runs one window
    enough.reset(seed=0)
    *_, info = enough.step(zeros(enough.action_space))
    assert not info["kv_exhausted"]
    enough.close()


def test_a_reset_prompt_too_long_for_the_pool_is_refused_before_the_episode_changes(world):  # noqa: F811
    needed = world.model.min_pages(world.config.env.prompt, world.knobs)
    env = worldstep.make_env(worldstep.load(world.config, num_pages=needed))
    env.reset(seed=0)
    env.step(zeros(env.action_space))
    with pytest.raises(ValueError, match=r"cache.num_pages=\d+ is invalid for options\['prompt'\]"):
        env.reset(seed=1, options={"prompt": "a much longer prompt " * 4})
    _, _, _, _, info = env.step(zeros(env.action_space))  # the episode is untouched
    assert info["window_index"] == 1
    env.close()


def test_unknown_reset_option_is_rejected_naming_the_allowed_keys(world):  # noqa: F811
    env = worldstep.make_env(world)
    env.reset(seed=0)
    env.step(zeros(env.action_space))
    with pytest.raises(ValueError, match=r"options\['promt'\] .*did you mean 'prompt'.*allowed keys: image, "
                                         r"prompt, domain_id"):
        env.reset(seed=1, options={"promt": "pick up the red cube"})
    _, _, _, _, info = env.step(zeros(env.action_space))
    assert info["window_index"] == 1
    env.close()
    vec = worldstep.world.make_vec_env(world, num_envs=2)
    with pytest.raises(ValueError, match=r"options\['camera'\]"):
        vec.reset(seed=0, options={"camera": ["wrist", "wrist"]})
    vec.close()


# --- the success judge ------------------------------------------------------------------------------


class JudgeSim(gym.Env):
    """A stand-in simulator whose pixel judge records what it was shown."""

    metadata = {"render_modes": []}
    calls: list = []

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict({"frames": gym.spaces.Box(0, 255, (4, 32, 32, 3), np.uint8)})
        self.action_space = gym.spaces.Box(-1, 1, (4, 2), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"frames": np.full((4, 32, 32, 3), seed % 256, np.uint8)}, {}

    @staticmethod
    def success_from_frames(first_frame, frames) -> bool:
        JudgeSim.calls.append((first_frame.copy(), frames.shape))
        return True


@pytest.fixture
def judge_sim():
    if "test/JudgeSim-v0" not in registry:
        register(id="test/JudgeSim-v0", entry_point=JudgeSim)
    JudgeSim.calls.clear()
    return "test/JudgeSim-v0"


def test_a_simulator_brings_its_success_judge_by_default(world, judge_sim):  # noqa: F811
    env = worldstep.make_env(world, simulator=judge_sim)
    env.reset(seed=7)
    _, reward, terminated, _, info = env.step(zeros(env.action_space))
    assert terminated and reward == 1.0 and info["is_success"]
    first, shape = JudgeSim.calls[-1]
    assert np.all(first == 7) and shape == (4, 32, 32, 3)  # the goal comes from the episode's first frame
    env.close()


def test_success_none_and_bad_judges(world, judge_sim):  # noqa: F811
    env = worldstep.make_env(world, simulator=judge_sim, success_fn="none")
    env.reset(seed=7)
    _, reward, terminated, _, info = env.step(zeros(env.action_space))
    assert not terminated and reward == 0.0 and not info["is_success"] and not JudgeSim.calls
    env.close()
    with pytest.raises(ValueError, match="success_fn='sim' is invalid with simulator=None"):
        worldstep.make_env(world, success_fn="sim")
    with pytest.raises(ValueError, match="success_fn='always'"):
        worldstep.make_env(world, success_fn="always")


def test_the_pusher_config_judges_with_pushsim(cache_dir):  # noqa: F811
    env = gym.make("worldstep/Pusher-v0")
    sim = gym.make("worldstep/PushSim-v0").unwrapped
    assert env.get_wrapper_attr("simulator_judge") == sim.success_from_frames
    env.close()


# --- infos, render fps, fork through wrappers ----------------------------------------------------------


def test_timings_and_kv_are_the_engine_records(world):  # noqa: F811
    env = worldstep.make_env(world)
    _, info = env.reset(seed=0)
    assert isinstance(info["kv"], KVStats)
    _, _, _, _, info = env.step(zeros(env.action_space))
    assert isinstance(info["timings"], PhaseTimings) and isinstance(info["kv"], KVStats)
    t = info["timings"]  # this session's share of its step's call; other_s: time outside the three phases
    assert t.total_s == pytest.approx(t.denoise_s + t.commit_s + t.decode_s + t.other_s) and t.other_s >= 0
    assert PhaseTimings(1.0, 2.0, 3.0) == PhaseTimings(4.0, 5.0, 6.0)  # measurements: seeded infos compare equal
    env.close()
    vec = worldstep.world.make_vec_env(world, num_envs=2)
    vec.reset(seed=0)
    *_, infos = vec.step(np.zeros(vec.action_space.shape, np.float32))
    assert infos["kv"]["pages_in_use"].shape == (2,) and infos["timings"]["decode_s"].shape == (2,)
    vec.close()


def test_render_fps_matches_the_frames_render_returns(world):  # noqa: F811
    # RenderCollection and RecordVideo take one render() per step
    env = gym.wrappers.RenderCollection(gym.make("worldstep/Tiny-v0", model=world, render_mode="rgb_array"))
    env.reset(seed=0)
    windows = 3
    for _ in range(windows):
        env.step(zeros(env.action_space))
    rendered = env.render()  # the reset frame, then one frame per window
    video_s = (len(rendered) - 1) / env.metadata["render_fps"]
    model_s = windows * env.unwrapped.knobs.chunk_size / env.metadata["frame_fps"]
    assert video_s == pytest.approx(model_s)  # a video of the renders plays in the model's time
    assert env.metadata["frame_fps"] == 15  # droid_lerobot's (tiny.yaml's domain 8), not the checkpoint's 24
    env.close()


def test_fork_env_keeps_gym_make_wrappers(world):  # noqa: F811
    env = gym.make("worldstep/Tiny-v0", model=world, max_episode_steps=3)
    env.reset(seed=0)
    env.step(zeros(env.action_space))
    fork = fork_env(env)
    assert [type(w) for w in _chain(fork)] == [type(w) for w in _chain(env)]
    assert isinstance(fork.unwrapped, WorldModelEnv) and fork.unwrapped is not env.unwrapped
    a = np.full(env.action_space.shape, 0.3, np.float32)
    assert np.array_equal(env.step(a)[0]["frames"], fork.step(a)[0]["frames"])
    *_, truncated, _ = fork.step(a)  # TimeLimit's count came along: step 3 of 3
    assert truncated
    with pytest.raises(TypeError, match="RecordRollout"):
        fork_env(RecordRollout(env, "unused"))
    with pytest.raises(TypeError, match="fork"):
        fork_env(gym.make("CartPole-v1"))
    fork.close()
    env.close()
    assert counts(world.model) == (0, 0, 0)


def _window_counters(env) -> list[str]:
    """The wrappers of ``env`` that count windows (gymnasium's TimeLimit, and WindowLimit, one)."""
    return [type(w).__name__ for w in _chain(env) if isinstance(w, (gym.wrappers.TimeLimit, WindowLimit))]


def _windows_until_truncated(env) -> int:
    env.reset(seed=0)
    for windows in range(1, 100):
        *_, terminated, truncated, _ = env.step(zeros(env.action_space))
        assert not terminated
        if truncated:
            return windows
    raise AssertionError("never truncated")


def test_gym_make_counts_the_windows_once(world):  # noqa: F811
    registered = gym.spec("worldstep/Tiny-v0").max_episode_steps
    assert world.config.env.max_windows == registered  # the shared world is the registered config's
    longer = gym.make("worldstep/Tiny-v0", model=world, max_episode_steps=registered + 1)
    assert _window_counters(longer) == ["TimeLimit"] and longer.spec.max_episode_steps == registered + 1
    assert _windows_until_truncated(longer) == registered + 1  # not cut at the config's max_windows
    shorter = gym.make("worldstep/Tiny-v0", model=world, max_windows=2)  # another limit: the env keeps its own
    assert _window_counters(shorter) == ["TimeLimit", "WindowLimit"] and shorter.get_wrapper_attr("max_windows") == 2
    assert _windows_until_truncated(shorter) == 2
    asked = gym.make("worldstep/Tiny-v0", model=world, max_windows=registered, max_episode_steps=registered + 1)
    assert _windows_until_truncated(asked) == registered  # an explicit max_windows is kept, even the registered one
    asked.close()
    other = worldstep.load("tiny", device="cpu", max_windows=3, **FAST)  # a World whose config says otherwise
    short_world = gym.make("worldstep/Tiny-v0", model=other)
    assert _window_counters(short_world) == ["TimeLimit", "WindowLimit"] and _windows_until_truncated(short_world) == 3
    for env in (longer, shorter, short_world):
        env.close()
    assert counts(world.model) == (0, 0, 0) and counts(other.model) == (0, 0, 0)
    spec = pickle.loads(pickle.dumps(gym.spec("worldstep/Tiny-v0")))  # an async vector env's workers get a copy
    remade = gym.make(spec, model=world)
    assert _window_counters(remade) == ["TimeLimit"] and remade.spec.max_episode_steps == registered
    remade.close()
    own = worldstep.make_env(world)  # make_env has no TimeLimit around it: its WindowLimit counts
    assert _window_counters(own) == ["WindowLimit"] and own.get_wrapper_attr("max_windows") == registered
    own.close()


def _chain(env):
    out = []
    while isinstance(env, gym.Wrapper):
        out.append(env)
        env = env.env
    return out


def test_vector_env_declares_frame_fps(world):  # noqa: F811
    vec = WorldModelVectorEnv(world.model, 2, world.knobs, embodiment="bridge_orig_lerobot")
    assert vec.metadata["frame_fps"] == 5  # the embodiment's fps
    assert vec.metadata["render_fps"] == 5 / world.knobs.chunk_size
    vec.close()
