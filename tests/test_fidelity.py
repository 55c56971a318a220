"""worldstep.fidelity: metrics that can fail, pixel policies, and the `--budget small` report end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
from worldstep.envs.push_policies import IdlePolicy, PixelPushPolicy
from worldstep.envs.push_sim import PushSimEnv, render_state
from worldstep.fidelity.openloop import object_errors
from worldstep.fidelity.rollouts import sim_episodes
from worldstep.measures.frames import psnr, ssim
from worldstep.measures.ranks import pearson, spearman
from worldstep.train.data import generate_clips, rollout_states


def _frames(n: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    clips = generate_clips(1, n, seed=seed)
    traj = rollout_states(clips.starts[0], clips.actions[0])
    frames = np.stack([render_state(s) for s in traj])
    states = np.stack([np.stack([s.effector, s.block, s.goal]) for s in traj])
    return frames, states


def test_psnr_and_ssim_rank_degradations():
    frames, _ = _frames()
    rng = np.random.default_rng(0)
    mild = np.clip(frames + rng.normal(0, 4, frames.shape), 0, 255).astype(np.uint8)
    harsh = np.clip(frames + rng.normal(0, 40, frames.shape), 0, 255).astype(np.uint8)
    assert np.all(psnr(frames, frames) == 60.0)
    assert np.all(psnr(mild, frames) > psnr(harsh, frames))
    assert np.allclose(ssim(frames, frames), 1.0)
    assert np.all(ssim(mild, frames) > ssim(harsh, frames)) and np.all(ssim(harsh, frames) < 0.9)
    # 8-bit MSE 1 everywhere is 48.13 dB
    assert np.isclose(psnr(frames.astype(np.int16) * 0 + 1, np.zeros_like(frames))[0], 48.13, atol=0.01)


def test_object_errors_small_on_truth_and_large_when_moved():
    frames, states = _frames(8)
    errs = object_errors(frames, states)
    assert np.nanmax(errs["effector"]) < 0.5 and np.nanmax(errs["block"]) < 0.7
    shifted = np.roll(frames, 6, axis=2)  # everything 6 px to the right
    moved = object_errors(shifted, states)
    assert np.nanmin(moved["block"]) > 5
    blank = object_errors(np.zeros_like(frames), states)
    assert np.isnan(blank["block"]).all()


def test_rank_correlations():
    assert np.isclose(spearman([1, 2, 3, 4], [10, 20, 30, 400]), 1.0)
    assert np.isclose(spearman([1, 2, 3, 4], [4, 3, 2, 1]), -1.0)
    assert np.isclose(spearman([0.0, 0.0, 0.5, 1.0], [0.1, 0.1, 0.4, 0.9]), 1.0)  # ties ranked alike
    assert np.isnan(pearson([1, 1, 1], [1, 2, 3]))
    assert np.isclose(pearson([1, 2, 3], [2, 4, 6]), 1.0)


def test_pixel_policies_are_graded_in_the_simulator():
    seeds = list(range(100, 106))
    results = sim_episodes([PixelPushPolicy(0.0), IdlePolicy()], seeds, max_windows=16, chunk=4)
    expert = np.mean([r.episode.success for r in results if r.policy == "oracle_noise0"])  # the default name
    idle = np.mean([r.episode.success for r in results if r.policy == "idle"])
    assert expert >= 0.5 and idle == 0.0


def test_pixel_policy_uses_frames_only():
    env = PushSimEnv()
    obs, _ = env.reset(seed=3)
    policy = PixelPushPolicy(0.0)
    policy.reset(seed=0)
    a = policy(obs)
    assert a.shape == (4, 2) and a.dtype == np.float32 and np.abs(a).max() <= 1
    policy.reset(seed=0)
    assert np.array_equal(policy({"frames": obs["frames"].copy()}), a)


def test_small_budget_report(tmp_path, capsys):
    from worldstep.fidelity.report import main

    report = main(["--budget", "small", "--out", str(tmp_path), "--threads", "1"])
    progress = capsys.readouterr().err  # a report takes minutes: it says what it is doing
    assert "fidelity:" in progress and "model rollouts" in progress and "task" in progress
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["split"] == "validation" and saved["episode_seeds"] == [20_000_000, 20_000_001]
    series = saved["open_loop"]["series"]
    assert set(series) == {"kv", "kv_shuffled_actions", "copy_first_frame_vae", "copy_first_frame",
                           "vae_reconstruction_ceiling"}
    kv = series["kv"]
    assert len(kv["psnr_db"]["value"]) == 2 and len(kv["ssim"]["low"]) == 2
    for name in ("object_vanish_rate", "block_vanish_rate", "moved_block_error_px"):
        assert len(kv[name]["value"]) == 2
    assert series["copy_first_frame"]["object_vanish_rate"]["value"] == [0.0, 0.0]  # the raw first frame
    policies = saved["policies"]
    assert len(policies["per_policy"]) == 10 and policies["floor"] == ["random", "idle"]
    assert policies["without_floor"]["policies"] == 8 and policies["all"]["policies"] == 10
    first = policies["per_policy"][0]
    assert sum(first["confusion"].values()) == 2 and len(first["sim_success"]["ci95"]) == 2
    assert set(saved["planning"]) >= {"model", "simulator", "base_policy"}
    assert {"lift", "planner_sim_success", "base_sim_success"} <= set(saved["planning"]["model"])
    by_k = saved["planning"]["model"]["by_confirm_windows"]
    assert list(by_k) == [str(k) for k in range(1, saved["planning"]["confirm_windows"] + 1)]
    for name in ("psnr.png", "ssim.png", "object_vanish.png", "moved_block_error.png", "policy_success.png",
                 "rollouts_sim_kv_copy.mp4"):
        assert (tmp_path / name).stat().st_size > 0
    assert set(report["targets"]) == {"spearman_without_floor", "mean_abs_rate_error_without_floor",
                                      "false_success_rate_without_floor", "precision_without_floor",
                                      "object_vanish_rate_last_window",
                                      "moved_block_error_below_copy_vae_every_window", "planning_lift_model_loop",
                                      "planning_lift_mpc_on_simulator"}
    assert report["targets"]["object_vanish_rate_last_window"]["met"] is False  # random weights must not pass
    from worldstep.fidelity.summary import render

    text = render(saved)  # the docs' tables come from this
    for heading in ("### Targets", "### Open loop", "### Policies", "### Planning"):
        assert heading in text
    assert text.count("| expert |") == 1 and "kv minus copy_first_frame_vae" in text
    assert "precision of the model's successes" in text and "false successes per window at risk" in text
    hazard = saved["policies"]["false_success_hazard"]
    assert hazard[0]["windows"] == [1, min(4, saved["policies"]["max_windows"])] and hazard[-1]["windows"][1] == \
        saved["policies"]["max_windows"] and {"value", "ci95", "windows_at_risk"} <= set(hazard[0])
    assert {"precision", "mmrv", "pearson"} <= set(saved["policies"]["without_floor"])

    # provenance: the commit, the code and weights that made the figures, the seed range, the command
    prov = saved["provenance"]
    assert len(prov["code_sha256"]) == 64 and len(prov["checkpoint_sha256"]) == 64
    assert prov["seed_range"] == {"name": "validation", "start": 20_000_000, "size": 10_000}
    assert prov["command"].startswith("python -m worldstep.fidelity --budget small")
    assert prov["git_dirty"] in (True, False, None)

    # every figure comes back from the per-unit records alone, and a changed record is caught
    from worldstep.fidelity.recompute import main as recompute

    assert recompute([str(tmp_path)]) == 0
    # a report that predates a figure still recomputes: the new figure is listed beside it, not a difference
    report_path = tmp_path / "report.json"
    kept = report_path.read_text()
    older = json.loads(kept)
    del older["policies"]["false_success_hazard"]
    report_path.write_text(json.dumps(older))
    capsys.readouterr()
    assert recompute([str(tmp_path)]) == 0
    assert "predates, computed from its records: /policies/false_success_hazard" in capsys.readouterr().out
    # --write keeps the report as it was and adds only what it predates, naming the commit that added it
    assert recompute([str(tmp_path), "--write", str(tmp_path / "judged.json")]) == 0
    judged = json.loads((tmp_path / "judged.json").read_text())
    with pytest.raises(ValueError, match="--write=.*no/such/folder"):
        recompute([str(tmp_path), "--write", str(tmp_path / "no" / "such" / "folder" / "judged.json")])
    assert judged.pop("recomputed")["added"] == ["/policies/false_success_hazard"]
    assert judged == json.loads(kept)
    report_path.write_text(kept)
    # a range renamed since the report (a sealed range becomes a read one): its recorded seeds name the range
    renamed = json.loads(kept)
    renamed["args"]["split"] = "test"
    report_path.write_text(json.dumps(renamed))
    assert recompute([str(tmp_path)]) == 0
    report_path.write_text(kept)
    episodes = (tmp_path / "records" / "episodes.jsonl").read_text().splitlines()
    first_model = next(json.loads(line) for line in episodes if json.loads(line)["world"] == "model")
    assert {"seed", "policy", "actions", "success", "replay_success", "stop", "detections"} <= set(first_model)
    assert len(first_model["actions"]) == first_model["windows"] == len(first_model["detections"])
    flipped = [line if json.loads(line) != first_model else
               json.dumps({**first_model, "replay_success": not first_model["replay_success"]}) for line in episodes]
    (tmp_path / "records" / "episodes.jsonl").write_text("\n".join(flipped) + "\n")
    assert recompute([str(tmp_path)]) == 1


def test_report_arguments_are_checked(tmp_path, capsys):
    from worldstep.fidelity.report import parse_args

    for argv, word in ((["--budget", "small", "--split", "train"], "split"),
                       (["--budget", "small", "--sections", "openloop,dreams"], "sections"),
                       (["--budget", "small", "--sections", "planning"], "planning needs policies"),
                       (["--budget", "small", "--base-policy", "psychic"], "base-policy"),
                       (["--budget", "small", "--plan-episodes", "9"], "plan-episodes"),
                       (["--budget", "small", "--plan-observe", "dreams"], "plan-observe"),
                       (["--budget", "full"], "checkpoint")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert word in capsys.readouterr().err, argv  # the error names the flag at fault
    args = parse_args(["--budget", "small", "--sections", "openloop", "--plan-observe", ""])
    assert args.sections == ["openloop"] and args.plan_observe == [] and args.split == "validation"


def test_demo_seed_rule_runs_the_demo_command_on_validation_seeds(tmp_path):
    from worldstep.envs.push_seeds import VALIDATION
    from worldstep.fidelity.demo_seed import main as demo_seed

    result = demo_seed(["--seeds", "2", "--windows", "1", "--out", str(tmp_path / "demo.json")])
    saved = json.loads((tmp_path / "demo.json").read_text())
    assert [r["seed"] for r in saved["seeds"]] == VALIDATION.episode_seeds(2)
    assert saved["agreement"]["episodes"] == 2 and "first validation seed" in saved["rule"]
    both = [r["seed"] for r in saved["seeds"] if r["model_success"] and r["simulator_success"]]
    assert result["demo_seed"] == (both[0] if both else None)
