"""ActionStats (cosmos-framework's normalizer-stats JSON) and the optional ActionNormalizer stage."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from worldstep.engine.embodiment.action_normalizer import ActionNormalizer, ActionRangeWarning
from worldstep.engine.embodiment.action_stats import ActionStats
from worldstep.engine.embodiment.embodiment import NormalizationKind
from worldstep.engine.embodiment.embodiments import EmbodimentRegistry

REGISTRY = EmbodimentRegistry.default()


def _quantile_stats(width=4):
    lo = np.linspace(-2.0, -0.5, width)
    return ActionStats(q01=lo, q99=lo + np.linspace(1.0, 4.0, width))


def test_reads_cosmos_framework_flat_and_nested_files(tmp_path):
    flat = tmp_path / "droid_like_stats.json"  # the layout of normalizer_stats/droid_lerobot_stats.json
    flat.write_text('{\n  "q01": [-0.0142, 0.0, 0.99],\n  "q99": [0.0145, 1.0, 1.0]\n}\n')
    stats = ActionStats.from_json(flat)
    assert stats.width == 3 and stats.has("q01", "q99") and not stats.has("mean")
    np.testing.assert_array_equal(stats.q01, np.float32([-0.0142, 0.0, 0.99]))

    nested = tmp_path / "libero_like.json"  # the layout of libero_native_frame_wise_relative_rot6d.json
    block = {k: [float(i), float(i) + 1] for i, k in enumerate(["mean", "std", "min", "max", "q01", "q99"])}
    block["min"], block["max"] = [-5.0, -5.0], [5.0, 5.0]
    raw_block = {**block, "q01": [-1.0, -1.0], "q99": [1.0, 1.0]}
    nested.write_text(json.dumps({"metadata": {"action_dim": 2}, "global": block, "global_raw": raw_block}))
    assert ActionStats.from_json(nested).q01.tolist() == [4.0, 5.0]  # "global" by default
    assert ActionStats.from_json(nested, key="global_raw").q01.tolist() == [-1.0, -1.0]
    assert ActionStats.from_json(nested).metadata == {"action_dim": 2}
    with pytest.raises(ValueError, match="'local' is missing; allowed: one of \\['global', 'global_raw'\\]"):
        ActionStats.from_json(nested, key="local")


def test_json_round_trip_is_exact_and_readable_flat(tmp_path):
    rng = np.random.default_rng(0)
    stats = ActionStats.compute(rng.normal(size=(500, 6)) * [1, 2, 3, 1e-4, 1e3, 0.5], metadata={"fps": 15})
    path = stats.to_json(tmp_path / "s.json")
    assert ActionStats.from_json(path) == stats
    raw = json.loads(path.read_text())
    assert set(raw) == {"q01", "q99", "mean", "std", "min", "max", "metadata"}  # flat: cosmos-framework loads it
    assert all(len(raw[k]) == 6 for k in raw if k != "metadata")


def test_compute_on_known_rows():
    rows = np.arange(101, dtype=np.float64)[:, None] * [1.0, -2.0]  # 0..100 and 0..-200
    stats = ActionStats.compute(rows)
    np.testing.assert_allclose(stats.q01, [1.0, -198.0])
    np.testing.assert_allclose(stats.q99, [99.0, -2.0])
    np.testing.assert_allclose(stats.mean, [50.0, -100.0])
    np.testing.assert_allclose(stats.std, [np.sqrt(850.0), 2 * np.sqrt(850.0)], rtol=1e-6)
    assert stats.min.tolist() == [0.0, -200.0] and stats.max.tolist() == [100.0, 0.0]
    assert stats.metadata["count"] == 101
    episodes = np.stack([rows, rows + 1])  # [episodes, T, D] -> rows
    assert ActionStats.compute(episodes).metadata["count"] == 202


@pytest.mark.parametrize("bad", [
    dict(q01=[0.0, 1.0], q99=[1.0]),  # widths differ
    dict(q01=[2.0], q99=[1.0]),  # q01 > q99
    dict(q01=[0.0]),  # q01 without q99
    dict(mean=[0.0], std=[-1.0]),
    dict(mean=[0.0]),
    dict(q01=[np.nan], q99=[1.0]),
    dict(q01=[[0.0]], q99=[[1.0]]),
    dict(),
])
def test_bad_stats_are_refused(bad):
    with pytest.raises(ValueError):
        ActionStats(**bad)


def _cosmos_quantile(a, q01, q99):  # cosmos-framework's normalize_action("quantile"), restated
    return 2.0 * (a - q01) / np.maximum(q99 - q01, 1e-8) - 1.0


def test_quantile_maps_q01_q99_to_minus_one_one_and_inverts():
    stats = _quantile_stats()
    norm = ActionNormalizer("quantile", stats)
    edges = np.stack([stats.q01, stats.q99, (stats.q01 + stats.q99) / 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # in range: no warning
        out = norm(edges)
    np.testing.assert_allclose(out.actions, [[-1] * 4, [1] * 4, [0] * 4], atol=1e-6)
    assert out.num_outside == 0 and out.num_clipped == 0
    raw = np.random.default_rng(1).uniform(stats.q01, stats.q99, size=(16, 4)).astype(np.float32)
    got = norm(raw).actions
    np.testing.assert_allclose(got, _cosmos_quantile(raw, stats.q01, stats.q99), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(norm.denormalize(got), raw, rtol=1e-5, atol=1e-5)
    assert got.dtype == np.float32 and got.shape == (16, 4)


def test_values_outside_the_stats_warn_and_pass_through_unless_clipped():
    stats = _quantile_stats()
    raw = np.stack([(stats.q01 + stats.q99) / 2] * 3)
    raw[0, 1] = stats.q99[1] + 10.0
    raw[2, 3] = stats.q01[3] - 10.0
    with pytest.warns(ActionRangeWarning, match=r"2 raw action values .* dimensions \[1, 3\]; passed through"):
        out = ActionNormalizer("quantile", stats)(raw)
    assert out.outside.sum() == 2 and out.outside[0, 1] and out.outside[2, 3]
    assert out.actions[0, 1] > 1.0 and out.actions[2, 3] < -1.0 and out.num_clipped == 0  # no silent clip
    with pytest.warns(ActionRangeWarning, match="clipped to"):
        clipped = ActionNormalizer("quantile", stats, clip=True)(raw)
    assert clipped.actions[0, 1] == 1.0 and clipped.actions[2, 3] == -1.0
    np.testing.assert_array_equal(clipped.clipped, out.outside)
    assert clipped.info() == {"actions_outside_stats": 2, "actions_clipped": 2}
    np.testing.assert_array_equal(np.delete(clipped.actions.ravel(), [1, 11]), np.delete(out.actions.ravel(), [1, 11]))


def test_meanstd_and_none():
    stats = ActionStats(mean=[1.0, -2.0], std=[2.0, 0.0], min=[-9.0, -9.0], max=[9.0, 9.0])
    norm = ActionNormalizer(NormalizationKind.MEAN_STD, stats)
    out = norm(np.float32([[3.0, -2.0]]))
    np.testing.assert_allclose(out.actions, [[1.0, 0.0]])  # std 0 is floored at 1e-8, as in training
    with pytest.warns(ActionRangeWarning, match=r"\[min, max\]"):
        assert norm(np.float32([[10.0, 0.0]])).num_outside == 1
    none = ActionNormalizer("none")
    raw = np.float32([[0.25, -7.0]])
    np.testing.assert_array_equal(none(raw).actions, raw)
    np.testing.assert_array_equal(none.denormalize(raw), raw)


def test_embodiments_carry_their_training_normalisation():
    assert ActionNormalizer.for_embodiment(REGISTRY.get("droid_lerobot")).kind is NormalizationKind.NONE
    bridge = REGISTRY.get("bridge_orig_lerobot")
    with pytest.raises(ValueError, match="needs stats with \\['q01', 'q99'\\]"):
        ActionNormalizer.for_embodiment(bridge)
    with pytest.raises(ValueError, match="stats are 4 wide but the actions are 10 wide"):
        ActionNormalizer.for_embodiment(bridge, _quantile_stats(4))
    norm = ActionNormalizer.for_embodiment(bridge, _quantile_stats(10))
    assert norm.kind is NormalizationKind.QUANTILE and norm.width == 10
    with pytest.raises(ValueError, match="'pusht'.*no published normalisation"):
        ActionNormalizer.for_embodiment(REGISTRY.get("pusht"))
    umi_file = _quantile_stats(20)  # UMI's stats file is 20-wide (two arms); one arm uses the first 10
    assert ActionNormalizer.for_embodiment(REGISTRY.get("umi"), umi_file.select(slice(0, 10))).width == 10


@pytest.mark.parametrize("kwargs, match", [
    (dict(kind="minmax"), "kind='minmax' is invalid"),
    (dict(kind="meanstd", stats=_quantile_stats()), "needs stats with \\['mean', 'std'\\]"),
    (dict(kind="meanstd", stats=ActionStats(mean=[0.0], std=[1.0]), clip=True), "clip=True is invalid"),
    (dict(kind="quantile", stats=_quantile_stats(), clip=1), "clip=1 is invalid"),
    (dict(kind="quantile", stats={"q01": [0.0], "q99": [1.0]}), "stats of type dict"),
])
def test_bad_normalizer_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ActionNormalizer(**kwargs)


@pytest.mark.parametrize("actions, match", [
    (np.zeros((4, 3)), r"shape \(4, 3\) is invalid; allowed: \[\.\.\., 4\]"),
    (np.full((4, 4), np.nan), "NaN or inf"),
    (np.zeros((4, 4), bool), "dtype bool"),
    (np.array(["a"] * 4), "dtype <U1"),
])
def test_bad_actions_are_refused(actions, match):
    with pytest.raises(ValueError, match=match):
        ActionNormalizer("quantile", _quantile_stats())(actions)
