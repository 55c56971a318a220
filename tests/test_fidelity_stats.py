"""worldstep.fidelity statistics: intervals, calibration and ranking tables, seed ranges, open-loop scoring."""

from __future__ import annotations

import numpy as np
import pytest
from worldstep.envs.push_policies import FLOOR, graded_policies
from worldstep.envs.push_seeds import DAGGER, READ_TESTS, SEALED_TEST, VALIDATION, range_of, split_range
from worldstep.episodes import EpisodeResult
from worldstep.fidelity.openloop import MOVED_PX, VANISHED_PX, held_out, per_window, score_frames
from worldstep.fidelity.ranking import group_stats, outcome_table, policy_report
from worldstep.fidelity.rollouts import EpisodeOutcome, sim_episodes
from worldstep.measures.intervals import bootstrap, bootstraps, mean_estimate, rate_dict, wilson


def test_bootstrap_interval_matches_the_binomial_spread():
    rng = np.random.default_rng(1)
    for n in (100, 400):
        x = (rng.random(n) < 0.3).astype(float)
        est = mean_estimate(x, seed=2)
        assert est.low < x.mean() < est.high
        width = est.high - est.low
        expected = 2 * 1.96 * np.sqrt(x.mean() * (1 - x.mean()) / n)
        assert 0.8 * expected < width < 1.2 * expected, (n, width, expected)


def test_a_stratified_bootstrap_resamples_each_stratum_within_itself():
    # statistic: how many indices fall in the first stratum; a plain bootstrap lets it vary, strata hold it at 10
    first = bootstrap(lambda idx: float((idx < 10).sum()), 50, resamples=200, seed=3, strata=(10, 40))
    assert (first.value, first.low, first.high) == (10.0, 10.0, 10.0)
    plain = bootstrap(lambda idx: float((idx < 10).sum()), 50, resamples=200, seed=3)
    assert plain.low < 10 < plain.high
    # without strata the draws are the ones a single stratum of every unit gives
    x = np.random.default_rng(5).random(30)
    assert bootstrap(lambda i: x[i].mean(), 30, seed=6) == bootstrap(lambda i: x[i].mean(), 30, seed=6, strata=[30])
    # several statistics from one pass give each one's own bootstrap (the same resamples)
    both = bootstraps(lambda i: [x[i].mean(), x[i].max()], 30, seed=6, strata=(10, 20))
    assert both == [bootstrap(lambda i: x[i].mean(), 30, seed=6, strata=(10, 20)),
                    bootstrap(lambda i: x[i].max(), 30, seed=6, strata=(10, 20))]
    for strata in ((10, 30), (0, 50), (60,)):
        with pytest.raises(ValueError, match="strata"):
            bootstrap(lambda idx: 0.0, 50, strata=strata)


def test_bootstrap_degenerate_cases():
    const = mean_estimate(np.ones(20))
    assert (const.value, const.low, const.high) == (1.0, 1.0, 1.0)
    undefined = bootstrap(lambda idx: float("nan"), 10)
    assert np.isnan(undefined.low) and np.isnan(undefined.high)
    with pytest.raises(ValueError, match="units"):
        bootstrap(lambda idx: 0.0, 0)


def test_wilson_interval_and_rate_dict():
    low, high = wilson(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-3)
    low, high = wilson(5, 10)
    assert (low, high) == (pytest.approx(0.2366, abs=1e-3), pytest.approx(0.7634, abs=1e-3))
    rate = rate_dict(np.array([True] * 3 + [False] * 7))
    assert rate["value"] == 0.3 and rate["successes"] == 3 and rate["episodes"] == 10
    assert rate["ci95"][0] < 0.3 < rate["ci95"][1] and rate["wilson95"][0] < 0.3 < rate["wilson95"][1]


def _results(table: np.ndarray, names: list[str], seeds: list[int], sim: bool,
             replay: np.ndarray | None = None) -> list[EpisodeOutcome]:
    replay = table if replay is None else replay
    return [EpisodeOutcome(EpisodeResult(index=0, seed=s, windows=1, success=bool(table[p, e])), n,
                           None if sim else bool(replay[p, e]))
            for p, n in enumerate(names) for e, s in enumerate(seeds)]


def test_a_model_that_agrees_everywhere_scores_perfectly():
    rng = np.random.default_rng(0)
    names, seeds = ["a", "b", "c", "idle"], list(range(40))
    p = np.array([0.9, 0.5, 0.2, 0.0])[:, None]
    sim = rng.random((4, 40)) < p
    report = policy_report(_results(sim, names, seeds, True), _results(sim, names, seeds, False), names, ("idle",),
                           seeds)
    graded = report["without_floor"]
    assert graded["policies"] == 3 and report["all"]["policies"] == 4
    assert graded["spearman"]["value"] == pytest.approx(1.0) and graded["mean_abs_rate_error"]["value"] == 0
    assert graded["false_success_rate"]["value"] == 0 and graded["selection_regret"]["value"] == 0
    assert report["model_pick"] == ["a"] and report["sim_best"] == ["a"]
    assert report["floor"] == ["idle"]


def test_confusion_false_and_missed_success_rates():
    sim = np.array([[True, True, False, False, False]])
    model = np.array([[True, False, True, False, False]])
    report = policy_report(_results(sim, ["x"], list(range(5)), True),
                           _results(model, ["x"], list(range(5)), False, replay=sim), ["x"], (), list(range(5)))
    stats = report["per_policy"][0]
    assert stats["confusion"] == {"model_success_sim_success": 1, "model_success_sim_failure": 1,
                                  "model_failure_sim_success": 1, "model_failure_sim_failure": 2}
    assert stats["false_success_rate"]["value"] == pytest.approx(1 / 3)
    assert stats["missed_success_rate"]["value"] == pytest.approx(1 / 2)
    assert stats["bias"]["value"] == pytest.approx(0.0)


def test_false_success_is_judged_by_the_replay_of_the_model_episodes_own_actions():
    # the simulator's own episodes all succeed, the model claims success everywhere, but its chunks replayed
    # in the simulator succeed only twice: the strict rule sees 3 false successes of 3 replay failures
    sim = np.array([[True] * 5])
    model = np.array([[True] * 5])
    replay = np.array([[True, True, False, False, False]])
    report = policy_report(_results(sim, ["x"], list(range(5)), True),
                           _results(model, ["x"], list(range(5)), False, replay=replay), ["x"], (), list(range(5)))
    stats = report["per_policy"][0]
    assert stats["false_success_rate"]["value"] == pytest.approx(1.0)
    assert stats["confusion"]["model_success_sim_failure"] == 3
    assert np.isnan(stats["paired_seed"]["false_success_rate"]["value"])  # no simulator failure to judge
    assert stats["paired_seed"]["episode_agreement"]["value"] == 1.0
    assert report["all"]["false_success_rate"]["value"] == pytest.approx(1.0)


def test_selection_regret_counts_ties_as_a_random_pick():
    sim = np.array([[True] * 8 + [False] * 2, [True] * 2 + [False] * 8])  # rates 0.8, 0.2
    model = np.array([[True] * 5 + [False] * 5, [True] * 5 + [False] * 5])  # tie at 0.5
    stats = group_stats(sim, model, model, seed=0)
    assert stats["selection_regret"]["value"] == pytest.approx(0.8 - 0.5)
    other = np.array([[False] * 10, [True] * 5 + [False] * 5])
    worse = group_stats(sim, other, other, seed=0)  # picks the 0.2 policy
    assert worse["selection_regret"]["value"] == pytest.approx(0.6)


def test_outcome_table_needs_every_episode():
    results = _results(np.ones((1, 2), bool), ["a"], [1, 2], True)
    assert outcome_table(results, ["a"], [1, 2]).all()
    with pytest.raises(KeyError):
        outcome_table(results, ["a"], [1, 2, 3])


def test_seed_ranges_are_disjoint_from_each_other_and_from_training_draws():
    from worldstep.train.args import TrainArgs
    from worldstep.train.data import generate_clips, mixture_seeds

    assert split_range("validation") is VALIDATION and split_range("test") is SEALED_TEST
    with pytest.raises(ValueError, match="split"):
        split_range("train")
    a, b = set(VALIDATION.seeds(VALIDATION.size)), set(SEALED_TEST.seeds(SEALED_TEST.size))
    assert not a & b
    assert not {s for s in a | b if s < 1_000_000}  # far from every seed tests, docs and the demo used
    with pytest.raises(ValueError, match="offset"):
        VALIDATION.seeds(10, offset=VALIDATION.size - 5)
    assert not set(VALIDATION.episode_seeds(100)) & set(VALIDATION.clip_seeds(100))
    defaults = TrainArgs()
    steps = defaults.windows * defaults.chunk
    train_seeds = set()
    for clips in (generate_clips(defaults.num_clips, steps, seed=defaults.seed),
                  generate_clips(max(8, defaults.num_clips // 20), steps, seed=defaults.seed + 10_000)):
        assert not [s for s in clips.seeds.tolist() if s in VALIDATION or s in SEALED_TEST]
    # the default run's own draws: the mixture (seeds only: drawing every clip's actions is slow) and the DAgger round
    for count, seed in ((defaults.num_clips - defaults.dagger_clips, defaults.seed),
                        (max(8, defaults.num_clips // 20), defaults.seed + 10_000)):
        train_seeds |= set(mixture_seeds(count, seed))
    train_seeds |= set(DAGGER.seeds(defaults.dagger_clips))
    assert not [s for s in train_seeds if s in VALIDATION or s in SEALED_TEST]
    assert not set(DAGGER.seeds(DAGGER.size)) & (a | b)
    # the sealed range shares no seed with the ranges already read, nor with anything trained or developed on
    for read_range in READ_TESTS:
        read = set(read_range.seeds(read_range.size))
        assert not read & (a | b) and split_range(read_range.name) is read_range and not train_seeds & b
    assert [r.name for r in READ_TESTS] == ["test_read", "test_read_2", "test_read_3", "test_read_4"]
    assert range_of(40_000_049) is READ_TESTS[1] and range_of(50_000_000) is READ_TESTS[2]
    assert range_of(60_000_000) is READ_TESTS[3] and range_of(70_000_000) is SEALED_TEST
    with pytest.raises(ValueError, match="seed=7"):
        range_of(7)
    read_sets = [set(r.seeds(r.size)) for r in READ_TESTS]
    assert all(not x & y for i, x in enumerate(read_sets) for y in read_sets[i + 1:])


def test_open_loop_scores_count_vanished_objects_as_failures():
    held = held_out(VALIDATION.clip_seeds(6), 16)
    truth = score_frames(held.truth, held)
    assert np.isfinite(truth.block_error).all() and np.nanmax(truth.block_error) < 0.7
    assert truth.moved.any(), "steered clips move some blocks within 16 steps"
    copy = score_frames(np.repeat(held.first[:, None], 16, axis=1), held)
    displacement = np.linalg.norm(held.states[:, :, 1] - held.start[:, None, 1], axis=-1)
    moved = truth.moved
    np.testing.assert_allclose(copy.moved_block_error[moved], displacement[moved], atol=0.7)
    assert (copy.moved_block_error[moved] >= MOVED_PX - 0.7).all() and np.isnan(copy.moved_block_error[~moved]).all()
    blank = score_frames(np.zeros_like(held.truth), held)
    assert np.isnan(blank.block_error).all()
    assert (blank.moved_block_error[moved] == VANISHED_PX).all()
    windows = per_window(np.isnan(blank.block_error).astype(float), 4)
    assert windows.shape == (6, 4) and (windows == 1).all()


def test_graded_policies_spread_in_the_simulator():
    policies = graded_policies()
    names = [p.name for p in policies]
    assert len([n for n in names if n not in FLOOR]) >= 8 and set(FLOOR) <= set(names)
    seeds = list(range(300, 330))
    chosen = [p for p in policies if p.name in ("expert", "noisy0.8", "noisy2", "idle")]
    results = sim_episodes(chosen, seeds, max_windows=16, chunk=4)
    rate = {n: np.mean([r.episode.success for r in results if r.policy == n])
            for n in ("expert", "noisy0.8", "noisy2", "idle")}
    assert rate["expert"] > rate["noisy0.8"] > rate["noisy2"] >= rate["idle"] == 0.0


def test_vectorised_mean_equals_the_generic_bootstrap():
    from worldstep.measures.intervals import nanmean

    x = np.random.default_rng(3).normal(size=37)
    x[[2, 9]] = np.nan
    fast, slow = mean_estimate(x, seed=4), bootstrap(lambda idx: nanmean(x[idx]), len(x), seed=4)
    assert (fast.value, fast.low, fast.high) == pytest.approx((slow.value, slow.low, slow.high), abs=1e-12)


def test_recompute_accepts_a_target_reworded_with_a_clause_but_not_a_new_threshold():
    from worldstep.fidelity.recompute import differences

    old = {"targets": {"lift": {"target": "ci95 low > 0", "met": False}}}
    clause = {"targets": {"lift": {"target": "ci95 low > 0, the model loop stopping on the streak", "met": False}}}
    assert differences(old, clause) == []
    assert differences(old, {"targets": {"lift": {"target": "ci95 low > 0.1", "met": False}}})
    assert differences(old, {"targets": {"lift": {"target": "ci95 low > 0, x", "met": True}}})
