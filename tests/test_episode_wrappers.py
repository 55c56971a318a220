"""NormalizeActions, JudgeSuccess and WindowLimit: composed by hand they are what make_env builds, batched they
report what each env reports alone from one engine call, and a window the pool could not hold is not judged."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import worldstep
from tiny_world import cache_dir, ramp, world, zeros  # noqa: F401 - fixtures
from worldstep.engine.embodiment.action_normalizer import ActionNormalizer, ActionRangeWarning
from worldstep.engine.embodiment.action_stats import ActionStats
from worldstep.envs import JudgeSuccess, NormalizeActions, WindowLimit, WorldModelEnv
from worldstep.envs.batched import step_batch

Q01 = np.linspace(-0.5, -0.05, 10).astype(np.float32)
Q99 = np.linspace(0.1, 0.8, 10).astype(np.float32)


def counts(model) -> tuple[int, int, int]:
    return model.kv.num_used_pages, model.decoder.live_warm_sessions, model.live_sessions


def _normalizer() -> ActionNormalizer:
    return ActionNormalizer("quantile", ActionStats(q01=Q01, q99=Q99), width=10)


def _bright(frames: np.ndarray) -> bool:
    return bool(frames.mean() > 40)


def _reward(frames: np.ndarray, actions: np.ndarray) -> float:
    return float(actions.sum()) + float(frames[-1].mean()) / 255


def _raw(scale: float) -> np.ndarray:
    return (Q01 + (Q99 - Q01) * np.linspace(0, 1, 4)[:, None] * scale).astype(np.float32)


def test_the_env_alone_only_runs_windows(world):  # noqa: F811
    env = WorldModelEnv(world.model, world.knobs, embodiment="droid_lerobot")
    env.reset(seed=0)
    for _ in range(3):
        _, reward, terminated, truncated, info = env.step(ramp(env.action_space))
        assert (reward, terminated, truncated) == (0.0, False, False) and "is_success" not in info
    env.close()
    assert counts(world.model) == (0, 0, 0)


def test_wrappers_by_hand_are_what_make_env_builds(world):  # noqa: F811
    kwargs = dict(embodiment="bridge_orig_lerobot", success_fn=_bright, reward_fn=_reward)
    built = worldstep.make_env(world, max_windows=2, action_normalizer=_normalizer(), **kwargs)
    with pytest.raises(gym.error.ResetNeeded):  # before the normaliser refuses the actions, as under gym.make
        built.step(np.full(built.action_space.shape, np.nan, np.float32))
    inner = WorldModelEnv(world.model, world.knobs, embodiment="bridge_orig_lerobot")
    by_hand = WindowLimit(JudgeSuccess(NormalizeActions(inner, _normalizer()), _bright, _reward), 2)
    assert [type(e) for e in _chain(built)] == [type(e) for e in _chain(by_hand)]
    assert built.action_space == by_hand.action_space and built.get_wrapper_attr("max_windows") == 2
    for env in (built, by_hand):
        env.reset(seed=3)
    for scale in (0.2, 0.9):
        got, want = built.step(_raw(scale)), by_hand.step(_raw(scale))
        assert np.array_equal(got[0]["frames"], want[0]["frames"]) and got[1:4] == want[1:4]
        assert {k: got[4][k] for k in ("is_success", "actions_outside_stats", "window_index")} == {
            k: want[4][k] for k in ("is_success", "actions_outside_stats", "window_index")}
        assert got[1] == pytest.approx(_reward(got[0]["frames"], _raw(scale)))  # the raw actions reach reward_fn
    assert got[3]  # the second window is the limit's
    with pytest.raises(ValueError, match="max_windows=0 is invalid"):
        built.set_wrapper_attr("max_windows", 0)
    built.close(), by_hand.close()
    assert counts(world.model) == (0, 0, 0)


def test_batched_steps_report_what_each_env_reports_alone_from_one_engine_call(world, monkeypatch):  # noqa: F811
    def make():
        return worldstep.make_env(world, max_windows=2, embodiment="bridge_orig_lerobot",
                                  action_normalizer=_normalizer(), success_fn=_bright, reward_fn=_reward)

    alone, batched = [make(), make()], [make(), make()]
    for i, env in enumerate(alone + batched):
        env.reset(seed=10 + i % 2)
    calls = []
    step = world.model.step
    monkeypatch.setattr(world.model, "step", lambda sessions, actions: calls.append(len(sessions)) or
                        step(sessions, actions))
    for scale in (0.3, 0.7):
        actions = [_raw(scale), _raw(1 - scale)]
        want = [env.step(a) for env, a in zip(alone, actions)]
        calls.clear()
        got = step_batch(batched, actions)
        assert calls == [2]  # one engine call for both
        for g, w in zip(got, want):
            assert g[1:4] == w[1:4] and set(g[4]) == set(w[4])
            assert (g[4]["is_success"], g[4]["actions_outside_stats"]) == (w[4]["is_success"],
                                                                          w[4]["actions_outside_stats"])
    assert all(g[3] for g in got)  # the window limit counted the batched windows
    for env in alone + batched:
        env.close()
    assert counts(world.model) == (0, 0, 0)


def test_a_batch_with_a_missing_row_or_one_env_twice_is_refused_before_any_work(world, monkeypatch):  # noqa: F811
    envs = [worldstep.make_env(world), worldstep.make_env(world)]
    for env in envs:
        env.reset(seed=0)
    calls = []
    monkeypatch.setattr(world.model, "step", lambda sessions, actions: calls.append(len(sessions)))
    a = zeros(envs[0].action_space)
    with pytest.raises(ValueError, match=r"len\(actions\)=1 is invalid; allowed: 2"):
        step_batch(envs, [a])
    with pytest.raises(ValueError, match="envs holds one env twice"):
        step_batch([envs[0], envs[0]], [a, a])
    assert calls == [] and [env.unwrapped.windows for env in envs] == [0, 0]
    for env in envs:
        env.close()


def test_a_window_the_pool_could_not_hold_is_not_judged(world):  # noqa: F811
    pages = world.model.min_pages(world.config.env.prompt, world.knobs)
    small = worldstep.load(world.config, num_pages=pages, context_frames=0)
    judged = []
    env = worldstep.make_env(small, max_windows=50, reward_fn=lambda frames, actions: judged.append(1) or 5.0,
                             success_fn=lambda frames: judged.append(1) or False)
    env.reset(seed=0)
    for _ in range(50):
        judged.clear()
        _, reward, terminated, truncated, info = env.step(zeros(env.action_space))
        if truncated:
            break
    assert info["kv_exhausted"] and (reward, terminated, info["is_success"]) == (0.0, False, False)
    assert not judged
    env.close()


def _chain(env: gym.Env) -> list[gym.Env]:
    out = [env]
    while isinstance(env, gym.Wrapper):
        env = env.env
        out.append(env)
    return out


def test_wrappers_reach_the_env_through_its_public_api(world):  # noqa: F811
    inner = WorldModelEnv(world.model, world.knobs, embodiment="bridge_orig_lerobot")
    assert inner.action_bounds == (-1.0, 1.0) and inner.first_image is None
    with pytest.raises(AttributeError):
        inner.action_bounds = None  # read-only: set_action_bounds is the way in
    for bad in ((1.0, -1.0), (0.0, float("inf")), [-1.0, 1.0], (True, 2)):
        with pytest.raises(ValueError, match=r"bounds=.* is invalid"):
            inner.set_action_bounds(bad)
    env = NormalizeActions(inner, _normalizer())
    assert inner.action_bounds is None  # the normaliser's actions may leave [-1, 1]
    image = np.full((32, 32, 3), 90, np.uint8)
    env.reset(seed=0, options={"image": image})
    assert np.array_equal(inner.first_image, image)
    outside = np.full(inner.action_space.shape, 3.0, np.float32)  # raw actions far past the stats' range
    with pytest.warns(ActionRangeWarning):
        env.step(outside)  # the engine holds the model's actions to no bounds
    env.close()


def test_window_limit_counts_its_own_windows(world):  # noqa: F811
    inner = WorldModelEnv(world.model, world.knobs, embodiment="bridge_orig_lerobot")
    env = WindowLimit(inner, 2)
    assert not isinstance(env, gym.wrappers.TimeLimit) and env.elapsed_windows == 0 and env.spec is None
    env.reset(seed=0)
    flags = [env.step(zeros(env.action_space))[3] for _ in range(3)]
    assert flags == [False, True, True] and env.elapsed_windows == 3  # truncated at the limit, as TimeLimit does
    env.max_windows = 5
    assert env.step(zeros(env.action_space))[3] is False  # 4 of 5
    env.reset(seed=0)
    assert env.elapsed_windows == 0
    env.close()
    registered = gym.make("worldstep/Tiny-v0", model=world, max_windows=2)
    assert registered.get_wrapper_attr("max_windows") == 2 and registered.spec.max_episode_steps == 32
    limit = next(w for w in _chain(registered) if isinstance(w, WindowLimit))
    assert limit.spec.max_episode_steps == 2 and limit.spec.id == "worldstep/Tiny-v0"  # TimeLimit's report
    registered.close()


def _still(space) -> np.ndarray:
    """No motion: zeros, with an identity 6-D rotation where the robot state reads one (columns 3..8)."""
    action = zeros(space)
    action[:, 3] = action[:, 7] = 1.0
    return action


def _checks_per_step(env: gym.Env, monkeypatch, action=zeros) -> int:
    """How many times one ``env.step(action(space))`` asks the env for its live episode."""
    base, calls = env.unwrapped, []
    live = base.live_episode
    monkeypatch.setattr(base, "live_episode", lambda: calls.append(1) or live())
    env.reset(seed=0)
    env.step(action(env.action_space))
    monkeypatch.undo()
    return len(calls)


def _stacks(world):  # noqa: F811
    return {
        "gym.make": lambda: gym.make("worldstep/Tiny-v0", model=world),
        "gym.make, max_windows": lambda: gym.make("worldstep/Tiny-v0", model=world, max_windows=4),
        "make_env, normalizer": lambda: worldstep.make_env(world, embodiment="bridge_orig_lerobot",
                                                           action_normalizer=_normalizer()),
    }


def test_the_episode_is_checked_once_per_step_at_the_outermost_wrapper(world, monkeypatch):  # noqa: F811
    for name, make in _stacks(world).items():
        env = make()
        assert _checks_per_step(env, monkeypatch) == 1, name
        env.close()
    outside = worldstep.make_env(world, robot_state=True, cameras=("exterior", "wrist"))  # wrappers around them
    assert _checks_per_step(outside, monkeypatch, _still) == 1
    outside.close()
    bare = WorldModelEnv(world.model, world.knobs, embodiment="bridge_orig_lerobot")
    assert _checks_per_step(bare, monkeypatch) == 1  # the env alone checks in its own step
    bare.close()
    assert counts(world.model) == (0, 0, 0)


def test_the_count_sees_a_check_repeated_by_every_layer(world, monkeypatch):  # noqa: F811
    """Each layer stepping the one below through its public ``step`` (the path before) checks once per layer."""
    from worldstep.envs.wrappers.episode import SplitStep

    def through_step(self, action, episode):
        inner, carry = self.step_in(action)
        return self.step_out(self.env.step(inner), action, carry)

    env = gym.make("worldstep/Tiny-v0", model=world, max_windows=4)  # WindowLimit > JudgeSuccess > WorldModelEnv
    with monkeypatch.context() as patched:
        patched.setattr(SplitStep, "step_live", through_step)
        assert _checks_per_step(env, monkeypatch) == 3
    assert _checks_per_step(env, monkeypatch) == 1
    env.close()
