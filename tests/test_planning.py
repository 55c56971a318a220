"""worldstep.planning: the pixel objective, the planner's forks and the closed loop judged by the simulator."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from worldstep.envs.push_policies import PixelPushPolicy
from worldstep.envs.push_sim import PUSHER_EMBODIMENT, PushSimEnv, PushState, render_state
from worldstep.planning import BlockToGoal, ModelPredictivePlanner, closed_loop


@pytest.fixture(scope="module")
def pusher_checkpoint(tmp_path_factory):
    """A tiny random 64x64 checkpoint that runs with the pusher config (fast; its frames are noise)."""
    from worldstep.engine.models.cosmos3.checkpoint import build_checkpoint
    from worldstep.fidelity.report import TINY_64

    path = build_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny64", TINY_64, seed=0)
    meta = json.loads((path / "worldstep.json").read_text())
    (path / "worldstep.json").write_text(json.dumps({**meta, "config": "pusher", "domain_id": 0,
                                                     "builtin_embodiments": False, "embodiments": [PUSHER_EMBODIMENT]}))
    return path


@pytest.fixture(scope="module")
def pusher_env(pusher_checkpoint):
    import worldstep

    env = worldstep.make_env(str(pusher_checkpoint), num_steps=1, max_windows=4, success_fn="none")
    yield env
    env.close()


def _frame(block, effector=(8.0, 8.0), goal=(40.0, 40.0)) -> np.ndarray:
    return render_state(PushState(np.array(effector), np.array(block), np.array(goal)))[None]


def test_block_to_goal_reads_pixels():
    cost = BlockToGoal(approach_weight=0.0)
    goal = np.array([40.0, 40.0])
    assert cost(_frame((40.0, 40.0)), goal) < 0.7
    assert cost(_frame((30.0, 40.0)), goal) == pytest.approx(10.0, abs=0.7)
    assert cost(np.zeros((1, 64, 64, 3), np.uint8), goal) == 64.0  # a vanished block costs the most
    near = BlockToGoal(approach_weight=1.0)(_frame((30.0, 40.0), effector=(20.0, 40.0)), goal)
    far = BlockToGoal(approach_weight=1.0)(_frame((30.0, 40.0), effector=(5.0, 5.0)), goal)
    assert near < far
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="approach_weight"):
            BlockToGoal(approach_weight=bad)


def test_planner_chooses_a_candidate_and_leaves_the_env_as_it_was(pusher_env):
    env = pusher_env
    model = env.unwrapped.model
    planner = ModelPredictivePlanner(env, PixelPushPolicy(1.0, name="noisy1"), candidates=3)
    planner.reset(seed=0)
    obs, _ = env.reset(seed=7)
    sessions, pages = model.live_sessions, model.kv.num_used_pages
    chosen = planner(obs)
    assert len(planner.last_costs) == 3 and chosen.shape == (4, 2)
    assert model.live_sessions == sessions and model.kv.num_used_pages == pages  # every fork closed
    after_planning, *_ = env.step(chosen)
    env.reset(seed=7)
    without_planning, *_ = env.step(chosen)
    assert np.array_equal(after_planning["frames"], without_planning["frames"])
    replay = PixelPushPolicy(1.0)
    replay.reset(seed=0)
    candidates = [replay(obs) for _ in range(3)]
    assert any(np.array_equal(chosen, c) for c in candidates)
    assert np.array_equal(chosen, candidates[int(np.argmin(planner.last_costs))])


def test_planner_rejects_bad_arguments(pusher_env):
    with pytest.raises(ValueError, match="candidates"):
        ModelPredictivePlanner(pusher_env, PixelPushPolicy(1.0), candidates=0)
    with pytest.raises(TypeError, match="env"):
        from worldstep.envs.push_sim import PushSimEnv

        ModelPredictivePlanner(PushSimEnv(), PixelPushPolicy(1.0))
    with pytest.raises(TypeError, match="proposal=42 is invalid"):
        ModelPredictivePlanner(pusher_env, 42)
    assert ModelPredictivePlanner(pusher_env, lambda obs: obs).proposal.fn(7) == 7  # a plain function is a policy


def test_closed_loop_in_both_modes(pusher_env):
    planner = ModelPredictivePlanner(pusher_env, PixelPushPolicy(1.0, name="noisy1"), candidates=2)
    for observe in ("model", "simulator"):
        result = closed_loop(pusher_env, planner, seed=3, max_windows=2, observe=observe)
        assert 1 <= result.episode.windows <= 2 and len(result.actions) == result.episode.windows
        assert (result.model_success is None) == (observe == "simulator")
        assert pusher_env.unwrapped.model.live_sessions == 1
    with pytest.raises(ValueError, match="observe"):
        closed_loop(pusher_env, planner, seed=3, observe="oracle")
    with pytest.raises(ValueError, match="max_windows"):
        closed_loop(pusher_env, planner, seed=3, max_windows=0)


def test_closed_loop_replays_chunks_in_the_simulator(pusher_env):
    """The simulator's verdict comes from replaying exactly the chunks the policy chose; observing the
    simulator, the expert acts on the simulator's own frames."""
    from worldstep.envs.push_sim import PushSimEnv

    result = closed_loop(pusher_env, PixelPushPolicy(0.0, name="expert"), seed=11, max_windows=4, observe="simulator")
    sim = PushSimEnv()
    obs, _ = sim.reset(seed=11)
    first, success = obs["frames"][0], False
    expert = PixelPushPolicy(0.0)
    expert.reset(seed=11)
    for actions in result.actions:
        assert np.array_equal(actions, expert(obs))
        obs, *_ = sim.step(actions)
        success = success or PushSimEnv.success_from_frames(first, obs["frames"])
    assert success == result.sim_success
    assert result.sim_success == (result.episode.windows < 4 or success)


def test_plan_command(pusher_checkpoint, tmp_path):
    from worldstep.cli import main as cli_main

    out = tmp_path / "plan.mp4"
    code = cli_main(["plan", "--config", str(pusher_checkpoint), "--windows", "1", "--candidates", "2", "--seed", "5",
                     "--set", "num_steps=1", "--compare", "--out", str(out)])
    assert code == 0 and out.stat().st_size > 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["candidates"] == 2 and summary["observe"] == "model" and summary["windows"] == 1
    assert isinstance(summary["sim_success"], bool) and isinstance(summary["base_sim_success"], bool)
    assert len(summary["actions"]) == 1 and np.asarray(summary["actions"][0]).shape == (4, 2)
    assert cli_main(["plan", "--config", str(pusher_checkpoint), "--proposal", "psychic", "--out", str(out)]) == 2


def test_a_failed_closed_loop_leaves_the_video_path_as_it_was(pusher_env, tmp_path):
    """The video is written under a temporary name and lands only when the episode ends; a policy that raises
    after the first frame is written leaves an earlier file untouched and no partial file behind."""
    class Crashes(PixelPushPolicy):
        def __call__(self, obs):  # after the first frame is written
            raise RuntimeError("policy crashed")

    video = tmp_path / "loop.mp4"
    video.write_bytes(b"an earlier run")
    with pytest.raises(RuntimeError, match="policy crashed"):
        closed_loop(pusher_env, Crashes(0.0), seed=3, max_windows=4, video_path=video)
    assert video.read_bytes() == b"an earlier run" and sorted(p.name for p in tmp_path.iterdir()) == ["loop.mp4"]
    result = closed_loop(pusher_env, PixelPushPolicy(0.0), seed=3, max_windows=2, video_path=video)
    assert result.episode.video == str(video) and video.read_bytes() != b"an earlier run"


def test_planner_imagines_horizon_windows_in_forks_and_checks_its_knobs(pusher_env):
    model = pusher_env.unwrapped.model
    planner = ModelPredictivePlanner(pusher_env, PixelPushPolicy(1.0, name="noisy1"), candidates=2, horizon=3,
                                     forks=2, goal=(32.0, 32.0))  # random weights: no goal to detect
    planner.reset(seed=1)
    obs, _ = pusher_env.reset(seed=5)
    sessions, pages = model.live_sessions, model.kv.num_used_pages
    chosen = planner(obs)
    assert [len(c) for c in planner.last_candidates] == [3, 3]  # each candidate is 3 windows long
    assert any(np.array_equal(chosen, c[0]) for c in planner.last_candidates)
    assert model.live_sessions == sessions and model.kv.num_used_pages == pages  # 2 x 2 forks closed
    for name, bad in (("horizon", 0), ("forks", 0), ("vanish_weight", -1.0), ("disagreement_weight", float("nan"))):
        with pytest.raises(ValueError, match=name):
            ModelPredictivePlanner(pusher_env, PixelPushPolicy(1.0), **{name: bad})


def test_disagreement_between_forks_raises_a_candidates_cost(pusher_env, monkeypatch):
    import worldstep.planning as planning

    sightings = iter(np.arange(1000.0))

    def detector(frame):  # every look sees the block somewhere else: the forks disagree
        x = next(sightings) % 40 + 10
        return {"effector": None, "block": np.array([x, 32.0]), "goal": np.array([32.0, 32.0])}

    monkeypatch.setattr(planning, "detect_objects", detector)
    knobs = {"candidates": 2, "forks": 2, "vanish_weight": 0.0, "goal": (32.0, 32.0),
             "objective": BlockToGoal(vanished_px=0.0)}
    costs = []
    for weight in (0.0, 100.0):
        planner = ModelPredictivePlanner(pusher_env, PixelPushPolicy(1.0), disagreement_weight=weight, **knobs)
        planner.reset(seed=2)
        obs, _ = pusher_env.reset(seed=9)
        planner(obs)
        costs.append(np.array(planner.last_costs))
    assert np.all(costs[1] > costs[0] + 50)  # spread >= 0.5 px per candidate, weighed 100


class _Believer:
    """Acts like the expert but records each window; used to check when a model-loop episode stops."""

    name = "believer"

    def __init__(self):
        self.inner = PixelPushPolicy(0.0)

    def reset(self, seed=None):
        self.inner.reset(seed)

    def __call__(self, obs):
        return self.inner(obs)


def test_a_model_loop_stops_only_on_its_own_belief_held_k_windows(pusher_env, monkeypatch):
    from worldstep.envs.push_sim import PushSimEnv

    shown = iter([True, False, True, True])  # what the model's frames show, window by window
    calls = []

    def success(first, frames):
        calls.append(len(calls))
        # closed_loop asks: the simulator's frames first, then the model's, once per window
        return False if len(calls) % 2 == 1 else next(shown)

    monkeypatch.setattr(PushSimEnv, "success_from_frames", staticmethod(success))
    result = closed_loop(pusher_env, _Believer(), seed=3, max_windows=4, observe="model", confirm_windows=2)
    assert result.episode.windows == 4 and result.stop == "believed_success" and result.model_success
    assert result.sim_success is False  # the simulator's outcome never stopped it
    with pytest.raises(ValueError, match="confirm_windows"):
        closed_loop(pusher_env, _Believer(), seed=3, confirm_windows=0)
    with pytest.raises(ValueError, match="anchor_every"):
        closed_loop(pusher_env, _Believer(), seed=3, observe="simulator", anchor_every=2)


def test_re_anchoring_restarts_the_model_from_the_simulator_every_k_windows(pusher_env, monkeypatch):
    images = []
    original_reset = pusher_env.reset

    def reset(*, seed=None, options=None):
        images.append(None if not options else options.get("image"))
        return original_reset(seed=seed, options=options)

    monkeypatch.setattr(pusher_env, "reset", reset)
    result = closed_loop(pusher_env, PixelPushPolicy(0.8, name="noisy0.8"), seed=4, max_windows=4, anchor_every=2)
    assert result.anchor_every == 2 and images[0] is None and len(images) == 1 + (result.episode.windows - 1) // 2


def test_the_planner_s_imagined_costs_are_ranked_against_the_simulator(pusher_env):
    planner = ModelPredictivePlanner(pusher_env, PixelPushPolicy(1.0, name="noisy1"), candidates=3, forks=1,
                                     goal=(32.0, 32.0))
    result = closed_loop(pusher_env, planner, seed=6, max_windows=2, observe="model")
    assert len(result.cost_rank_correlation) == result.episode.windows
    assert all(r is None or -1.0 <= r <= 1.0 for r in result.cost_rank_correlation)


class _Flicker(gym.Wrapper):
    """A model whose frames show success on the windows ``schedule`` marks True, and not on the others: the
    block is drawn on the goal of the simulator's scene, or where the scene started."""

    def __init__(self, env, schedule):
        super().__init__(env)
        self.schedule = list(schedule)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        sim = PushSimEnv(chunk_size=self.env.action_space.shape[0])
        sim.reset(seed=info["scene_seed"])
        self.start, self.window = sim.state, 0
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        s = self.start
        block = s.goal if self.schedule[self.window] else s.block
        frame = render_state(PushState(s.effector, np.array(block), s.goal))
        self.window += 1
        frames = np.repeat(frame[None], len(obs["frames"]), axis=0)
        return {**obs, "frames": frames}, reward, terminated, truncated, info


def test_k1_and_k2_stop_on_different_windows_of_a_flickering_model(pusher_env):
    flicker = [True, False, True, True]  # a one-window flicker at window 1, then held at windows 3-4 (the limit)
    stops = {}
    for k in (1, 2, 3):
        env = _Flicker(pusher_env, flicker)
        result = closed_loop(env, _Believer(), seed=5, max_windows=4, observe="model", confirm_windows=k)
        stops[k] = (result.episode.windows, result.stop)
    assert stops == {1: (1, "believed_success"), 2: (4, "believed_success"), 3: (4, "env_end")}


def test_a_model_loop_refuses_an_env_that_judges_success_itself(pusher_env):
    from worldstep.envs.wrappers.episode import JudgeSuccess

    judged = JudgeSuccess(_Flicker(pusher_env, [False, True, False, True]), "sim")
    # the bug it prevents: the env ends the episode at the first window that shows success, whatever k is
    judged.reset(seed=5)
    ends = [judged.step(np.zeros(judged.action_space.shape, np.float32))[2] for _ in range(2)]
    assert ends == [False, True]
    with pytest.raises(ValueError, match="success_fn='none'"):
        closed_loop(judged, _Believer(), seed=5, max_windows=6, observe="model", confirm_windows=2)
    result = closed_loop(judged, _Believer(), seed=5, max_windows=1, observe="simulator")  # MPC: the sim decides
    assert result.episode.windows == 1


def test_the_fidelity_planner_env_judges_nothing(pusher_checkpoint):
    from worldstep.engine.config import RolloutKnobs
    from worldstep.fidelity.tasks import Worker
    from worldstep.planning import judges_success
    from worldstep.recipes.open_loop import RolloutRecipe

    recipe = RolloutRecipe(prompt="A robot pushes a block to the goal.", domain_id=0, knobs=RolloutKnobs(num_steps=1))
    worker = Worker(str(pusher_checkpoint), threads=1, recipe=recipe)
    try:
        assert not judges_success(worker.env)
    finally:
        worker.close()


def test_one_run_tells_where_every_smaller_confirmation_count_stops(pusher_env):
    flicker = [True, False, True, True]
    longest = closed_loop(_Flicker(pusher_env, flicker), _Believer(), seed=5, max_windows=4, observe="model",
                          confirm_windows=3)
    assert [w[0] for w in longest.window_success] == flicker
    for k in (1, 2, 3):
        run = closed_loop(_Flicker(pusher_env, flicker), _Believer(), seed=5, max_windows=4, observe="model",
                          confirm_windows=k)
        assert longest.stopped_at(k) == (run.episode.windows, run.model_success, run.sim_success)
    again = type(longest).from_record(longest.to_record())
    assert again.stopped_at(2) == longest.stopped_at(2)
    first = closed_loop(_Flicker(pusher_env, flicker), _Believer(), seed=5, max_windows=4, observe="model",
                        confirm_windows=1)
    with pytest.raises(ValueError, match="confirm_windows=2"):
        first.stopped_at(2)  # it stopped at window 1: where k = 2 stops is not known from it


def test_the_selective_stop_claims_only_where_the_rule_s_signals_pass(pusher_env):
    from worldstep.trust import SelectiveRule

    held = [True, True, True, True]  # the model's frames show success from window 1 on
    streak = closed_loop(_Flicker(pusher_env, held), _Believer(), seed=5, max_windows=4, observe="model")
    assert (streak.episode.windows, streak.stop, streak.stop_rule_sha256) == (1, "believed_success", None)
    rule = SelectiveRule(persistence_min=3)
    result = closed_loop(_Flicker(pusher_env, held), _Believer(), seed=5, max_windows=4, observe="model",
                         stop_rule=rule)
    assert (result.episode.windows, result.stop, result.model_success) == (3, "claimed_success", True)
    assert result.stop_rule_sha256 == rule.sha256
    assert [t["persistence"] for t in result.window_trust] == [1, 2, 3]
    assert [t["window"] for t in result.window_trust] == [1, 2, 3]
    assert [t["consistency"] for t in result.window_trust][1:] == [0.0, 0.0]  # the tracker read the frames
    again = type(result).from_record(json.loads(json.dumps(result.to_record())))
    assert (again.stop_rule_sha256, again.window_trust) == (rule.sha256, result.window_trust)
    assert result.stopped_at(2) == (2, True, result.window_success[1][1])  # the streak's stops are still known
    with pytest.raises(ValueError, match="confirm_windows=4"):
        result.stopped_at(4)


def test_a_rule_that_never_passes_never_stops_the_loop(pusher_env):
    from worldstep.trust import SelectiveRule

    for rule in (SelectiveRule(persistence_min=99), SelectiveRule(horizon_max=0.0)):  # a window's horizon is > 0
        result = closed_loop(_Flicker(pusher_env, [True] * 4), _Believer(), seed=5, max_windows=4, observe="model",
                             stop_rule=rule, trained_horizon=4)
        assert result.stop != "claimed_success" and not result.model_success and result.episode.windows == 4
        assert [w[0] for w in result.window_success] == [True] * 4  # the model believed, the rule did not claim


def test_the_selective_stop_reads_the_horizon_and_the_tracker(pusher_env, monkeypatch):
    from worldstep.trust import PushTracker, SelectiveRule

    # horizon: window / trained_horizon; past 0.5 of a 4-window horizon no success is claimed
    late = closed_loop(_Flicker(pusher_env, [False, False, True, True]), _Believer(), seed=5, max_windows=4,
                       observe="model", stop_rule=SelectiveRule(horizon_max=0.5), trained_horizon=4)
    assert late.stop != "claimed_success" and [t["horizon"] for t in late.window_trust] == [0.25, 0.5, 0.75, 1.0]
    early = closed_loop(_Flicker(pusher_env, [False, True, True, True]), _Believer(), seed=5, max_windows=4,
                        observe="model", stop_rule=SelectiveRule(horizon_max=0.5), trained_horizon=4)
    assert (early.episode.windows, early.stop) == (2, "claimed_success")
    # consistency: the tracker's residual, window by window, must be at most the threshold
    residuals = iter([5.0, 4.0, 1.0, 1.0])
    monkeypatch.setattr(PushTracker, "residual", lambda self, previous, frames, actions: next(residuals))
    result = closed_loop(_Flicker(pusher_env, [True] * 4), _Believer(), seed=5, max_windows=4, observe="model",
                         stop_rule=SelectiveRule(consistency_max=3.0))
    assert (result.episode.windows, result.stop) == (3, "claimed_success")
    assert [t["consistency"] for t in result.window_trust] == [5.0, 4.0, 1.0]


def test_the_selective_stop_refuses_a_rule_it_cannot_apply(pusher_env):
    from worldstep.trust import SelectiveRule

    cases = [({"stop_rule": SelectiveRule(agreement_min=1.0)}, "agreement_min"),
             ({"stop_rule": SelectiveRule(horizon_max=1.0)}, "trained_horizon=None"),
             ({"stop_rule": SelectiveRule(), "observe": "simulator"}, "observe='simulator'"),
             ({"stop_rule": SelectiveRule(), "trained_horizon": 0}, "trained_horizon=0")]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            closed_loop(pusher_env, _Believer(), seed=5, max_windows=1, **{"observe": "model", **kwargs})
    with pytest.raises(TypeError, match="stop_rule"):
        closed_loop(pusher_env, _Believer(), seed=5, max_windows=1, stop_rule={"persistence_min": 2})
