"""worldstep.trust: each trust signal measures what it says, the rule and the selective judge abstain where they
must, on a scripted env (model-agnostic) and on the shipped pusher model."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from worldstep.envs.push_policies import PixelPushPolicy
from worldstep.envs.push_sim import PushSimEnv, detect_objects
from worldstep.trust import PushTracker, SelectiveJudge, SelectiveRule, TrustSignals, TrustSignalsWrapper
from worldstep.trust.signals import trained_horizon_of

PUSH = np.array([[1.0, 0.0]] * 4, dtype=np.float32)


class ScriptedWorld(gym.Env):
    """PushSim frames; the judge's verdict per window and each fork's verdict per window come from scripts."""

    def __init__(self, success: list[bool], fork_success: list[list[bool]] | None = None) -> None:
        self.sim, self.success, self.fork_success = PushSimEnv(chunk_size=4), success, fork_success or []
        self.action_space, self.observation_space = self.sim.action_space, self.sim.observation_space
        self.t, self.forks_made, self.forks_closed = 0, [], []

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self.sim.reset(seed=seed)[0], {}

    def step(self, action):
        obs, *_ = self.sim.step(action)
        ok = self.success[self.t]
        self.t += 1
        return obs, float(ok), ok, False, {"is_success": ok}

    def fork(self, seed=None):
        parent = self

        class Fork(gym.Env):
            def step(self, action):
                ok = parent.fork_success[parent.t - 1][self.k]  # the parent stepped this window first
                return None, 0.0, ok, False, {"is_success": ok}

            def close(self):
                parent.forks_closed.append(seed)

        fork = Fork()
        fork.k = sum(1 for s in self.forks_made if s[0] == self.t)
        self.forks_made.append((self.t, seed))
        return fork


def test_horizon_and_persistence_count_windows_and_the_success_streak():
    env = TrustSignalsWrapper(ScriptedWorld([False, True, True, False, True]), trained_horizon=2)
    env.reset(seed=3)
    trust = [env.step(PUSH)[4]["trust"] for _ in range(5)]
    assert [t.window for t in trust] == [1, 2, 3, 4, 5]
    assert [t.horizon for t in trust] == [0.5, 1.0, 1.5, 2.0, 2.5]
    assert [t.persistence for t in trust] == [0, 1, 2, 0, 1]
    assert all(t.consistency is None and t.agreement is None for t in trust)  # not configured: not measured
    env.reset(seed=3)
    assert env.step(PUSH)[4]["trust"].window == 1  # a reset starts the count again


def test_agreement_is_the_share_of_forks_whose_judge_agrees_and_every_fork_is_closed():
    world = ScriptedWorld([True, False], fork_success=[[True, False, True, True], [True, True, True, False]])
    env = TrustSignalsWrapper(world, agreement_forks=4, seed=7)
    env.reset(seed=0)
    assert env.step(PUSH)[4]["trust"].agreement == 0.75  # main True: 3 of 4 forks say True
    assert env.step(PUSH)[4]["trust"].agreement == 0.25  # main False: 1 of 4 forks says False
    assert len(world.forks_made) == 8 and sorted(world.forks_closed) == sorted(s for _, s in world.forks_made)
    assert len({s for _, s in world.forks_made}) == 8  # each fork its own noise seed


def test_the_tracker_sees_the_models_own_previous_frame():
    seen = []

    class Spy:
        def residual(self, previous_frame, frames, actions):
            seen.append((previous_frame.copy(), np.asarray(frames)[-1].copy()))
            return 1.5

    env = TrustSignalsWrapper(ScriptedWorld([False, False]), tracker=Spy())
    obs, _ = env.reset(seed=1)
    first = obs["frames"][-1].copy()
    assert env.step(PUSH)[4]["trust"].consistency == 1.5
    env.step(PUSH)
    assert np.array_equal(seen[0][0], first) and np.array_equal(seen[1][0], seen[0][1])


def test_push_tracker_residual_is_small_on_the_simulator_and_large_when_the_block_jumps():
    sim = PushSimEnv(chunk_size=4)
    tracker = PushTracker()
    residuals, moved = [], []
    for seed in range(4):
        obs, _ = sim.reset(seed=seed)
        expert = PixelPushPolicy(0.0, 4)
        expert.reset(seed=seed)
        for _ in range(8):
            actions = expert(obs)
            previous = obs["frames"][-1]
            obs, *_ = sim.step(actions)
            residuals.append(tracker.residual(previous, obs["frames"], actions))
            moved.append(np.linalg.norm(detect_objects(obs["frames"][-1])["block"] - detect_objects(previous)["block"]))
    assert sum(m > 3 for m in moved) >= 5  # the expert pushes the block: the actions matter
    assert max(r for r in residuals if r is not None) < 1.0  # the simulator obeys its own rules
    # injected violation: the block drawn 6 px away from where the actions put it
    obs, _ = sim.reset(seed=0)
    previous = obs["frames"][-1]
    obs, *_ = sim.step(PUSH)
    shifted = np.roll(obs["frames"], 6, axis=2)  # every object 6 px to the right
    assert tracker.residual(previous, shifted, PUSH) > 4.0
    lost = obs["frames"].copy()
    lost[..., 2] = lost[..., 0]  # no blue: the block vanished
    assert tracker.residual(previous, lost, PUSH) == float("inf")


def test_rule_names_the_first_failing_or_missing_signal_and_its_hash_follows_the_thresholds():
    rule = SelectiveRule(horizon_max=1.0, consistency_max=2.0, persistence_min=2)
    ok = TrustSignals(window=3, horizon=0.75, consistency=1.0, persistence=2)
    assert rule.failing(ok) is None
    assert rule.failing(TrustSignals(window=9, horizon=1.125, consistency=1.0, persistence=2)) == "horizon"
    assert rule.failing(TrustSignals(window=3, horizon=0.75, consistency=2.5, persistence=2)) == "consistency"
    assert rule.failing(TrustSignals(window=3, horizon=0.75, consistency=None, persistence=2)) == "consistency"
    assert rule.failing(TrustSignals(window=3, horizon=0.75, consistency=1.0, persistence=1)) == "persistence"
    assert SelectiveRule(agreement_min=0.5).failing(TrustSignals(window=1, agreement=0.25)) == "agreement"
    assert SelectiveRule().failing(TrustSignals(window=1)) is None
    assert rule.sha256 == SelectiveRule.from_dict(json.loads(json.dumps(rule.to_dict()))).sha256
    assert rule.sha256 != SelectiveRule(horizon_max=1.0, consistency_max=2.5, persistence_min=2).sha256
    with pytest.raises(ValueError, match="consistency_max=-1"):
        SelectiveRule(consistency_max=-1)
    with pytest.raises(ValueError, match="agreement_min=1.5"):
        SelectiveRule(agreement_min=1.5)
    with pytest.raises(TypeError, match="radius"):
        SelectiveRule.from_dict({"radius": 2})


def test_selective_judge_abstains_naming_the_signal_and_claims_once_success_has_held():
    world = ScriptedWorld([True, True, True])
    env = SelectiveJudge(TrustSignalsWrapper(world, trained_horizon=8), SelectiveRule(persistence_min=2))
    env.reset(seed=2)
    _, _, terminated, _, info = env.step(PUSH)
    assert info["judged_success"] and not info["is_success"] and info["abstained"] == "persistence"
    assert not terminated  # the episode goes on, so the success can hold
    _, _, terminated, _, info = env.step(PUSH)
    assert info["is_success"] and info["abstained"] is None and terminated
    with pytest.raises(ValueError, match="TrustSignalsWrapper"):
        SelectiveJudge(world, SelectiveRule())


def test_wrapper_arguments_are_checked():
    world = ScriptedWorld([False])
    for kwargs, word in (({"trained_horizon": 0}, "trained_horizon=0"), ({"agreement_forks": -1}, "agreement_forks"),
                         ({"tracker": object()}, "tracker")):
        with pytest.raises(ValueError, match=word):
            TrustSignalsWrapper(world, **kwargs)
    with pytest.raises(TypeError):
        TrustSignalsWrapper(world, horizon=8)


def test_trained_horizon_is_read_from_the_checkpoint(tmp_path):
    assert trained_horizon_of(tmp_path) is None
    (tmp_path / "worldstep.json").write_text(json.dumps({"trained_horizon_windows": 8}))
    assert trained_horizon_of(tmp_path) == 8


def test_signals_on_the_pusher_model_with_forks_that_share_the_past():
    import worldstep

    env = worldstep.make_env("pusher", num_steps=1, max_windows=4)
    model = env.unwrapped.model
    wrapped = TrustSignalsWrapper(env, trained_horizon=2, tracker=PushTracker(), agreement_forks=2, seed=0)
    try:
        wrapped.reset(seed=5)
        pages = model.kv.pages_in_use(env.unwrapped.episode.session.session_id)
        trust = [wrapped.step(PUSH)[4]["trust"] for _ in range(3)]
        assert [t.horizon for t in trust] == [0.5, 1.0, 1.5]
        assert all(t.agreement in (0.0, 0.5, 1.0) and t.persistence is not None for t in trust)
        assert all(t.consistency is not None and t.consistency >= 0 for t in trust)
        assert model.kv.pages_in_use(env.unwrapped.episode.session.session_id) >= pages
        assert len(model.scheduler.sessions()) == 1  # every fork closed after its window
    finally:
        wrapped.close()


def test_the_trained_horizon_comes_from_the_config_else_the_checkpoint_else_none(tmp_path):
    import shutil
    from pathlib import Path

    from worldstep.config import load_config
    from worldstep.trust import trained_horizon_for

    shipped = Path(__file__).parents[1] / "configs" / "models" / "pusher"
    assert trained_horizon_for("pusher") == 8 == trained_horizon_for(str(shipped))  # embedded and a folder
    assert trained_horizon_for("tiny") is None  # none by default
    assert trained_horizon_for(load_config("tiny").with_overrides(trained_horizon=6)) == 6  # set where none is
    assert trained_horizon_for(load_config("pusher").with_overrides(**{"model.trained_horizon": 12})) == 12
    folder = tmp_path / "ckpt"
    shutil.copytree(shipped, folder, ignore=shutil.ignore_patterns("transformer", "vae"))  # metadata is enough
    meta = json.loads((folder / "worldstep.json").read_text())
    del meta["trained_horizon_windows"]
    (folder / "worldstep.json").write_text(json.dumps(meta))
    assert trained_horizon_for(str(folder)) is None
    (folder / "worldstep.json").write_text(json.dumps({**meta, "trained_horizon_windows": 0}))
    with pytest.raises(ValueError, match="trained_horizon_windows=0"):
        trained_horizon_for(str(folder))
    for bad in (0, 2.5, "8", True):
        with pytest.raises(ValueError, match="model.trained_horizon"):
            load_config("pusher").with_overrides(trained_horizon=bad)


def test_make_env_with_trust_picks_up_the_model_s_trained_horizon():
    import worldstep

    env = worldstep.make_env("pusher", num_steps=1, max_windows=2, trust={"tracker": PushTracker()})
    try:
        env.reset(seed=20_000_000)
        trust = env.step(PUSH)[4]["trust"]
        assert trust.horizon == 1 / 8 and trust.consistency is not None
    finally:
        env.close()
    env = gym.make("worldstep/Pusher-v0", num_steps=1, trust=True, trained_horizon=4)  # the config key wins
    try:
        env.reset(seed=20_000_000)
        assert env.step(PUSH)[4]["trust"].horizon == 1 / 4
    finally:
        env.close()
    with pytest.raises(ValueError, match="trust="):
        worldstep.make_env("tiny", trust="yes")
    with pytest.raises(TypeError, match="bogus"):
        worldstep.make_env("tiny", trust={"bogus": 1})


def test_vector_trust_per_row_equals_the_single_env_wrapper_and_restarts_at_autoreset():
    from worldstep.trust.vector import TrustSignalsVectorWrapper

    scripts = [[False, True, True, True], [False, False, True, False, False, False, False, False]]
    vec = TrustSignalsVectorWrapper(gym.vector.SyncVectorEnv([lambda s=s: ScriptedWorld(s) for s in scripts]),
                                    trained_horizon=2, tracker=PushTracker())
    vec.reset(seed=[3, 4])
    rows = [[], []]
    for _ in range(4):
        _, _, terminated, _, info = vec.step(np.stack([PUSH, PUSH]))
        for i in range(2):
            rows[i].append(info["trust"][i] if info["_trust"][i] else None)
    for i, script in enumerate(scripts):
        single = TrustSignalsWrapper(ScriptedWorld(script), trained_horizon=2, tracker=PushTracker())
        single.reset(seed=3 + i)
        expected = [single.step(PUSH)[4]["trust"] for _ in range(script.index(True) + 1)]  # to its end (success)
        assert rows[i][: len(expected)] == expected
    # row 0 ended at window 2: window 3 was its reset (no signals), window 4 the new episode's first
    assert rows[0][2] is None and rows[0][3].window == 1 and rows[0][3].persistence == 0
    assert rows[1][2].persistence == 1 and rows[1][3] is None
    with pytest.raises(ValueError, match="autoreset_mode"):
        TrustSignalsVectorWrapper(gym.vector.SyncVectorEnv([lambda: ScriptedWorld([True])],
                                                           autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))
    with pytest.raises(TypeError, match="VectorEnv"):
        TrustSignalsVectorWrapper(ScriptedWorld([True]))


def test_gym_make_vec_with_trust_gives_each_row_its_signals():
    env = gym.make_vec("worldstep/Pusher-v0", num_envs=2, vectorization_mode="vector_entry_point", num_steps=1,
                       trust={"tracker": PushTracker()})
    try:
        env.reset(seed=[20_000_000, 20_000_001])
        _, _, _, _, info = env.step(np.stack([PUSH, PUSH]))
        assert info["_trust"].tolist() == [True, True]
        assert [t.horizon for t in info["trust"]] == [1 / 8, 1 / 8]
        assert all(t.consistency is not None for t in info["trust"])
    finally:
        env.close()
