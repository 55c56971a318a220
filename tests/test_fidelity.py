"""worldstep.fidelity: metrics that can fail, pixel policies, and the `--budget small` report end to end."""

from __future__ import annotations

import json

import numpy as np
from worldstep.envs.push_sim import PushSimEnv, render_state
from worldstep.fidelity.metrics import object_errors, pearson, psnr, spearman, ssim
from worldstep.fidelity.policies import IdlePolicy, PixelPushPolicy
from worldstep.fidelity.rollouts import sim_episodes
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
    expert = np.mean([r.success for r in results if r.policy == "oracle_noise0"])
    idle = np.mean([r.success for r in results if r.policy == "idle"])
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
    from worldstep.fidelity import main

    report = main(["--budget", "small", "--out", str(tmp_path), "--threads", "1"])
    progress = capsys.readouterr().err  # a report takes minutes: it says what it is doing
    assert "fidelity:" in progress and "model rollouts" in progress and "task" in progress
    saved = json.loads((tmp_path / "report.json").read_text())
    kv = saved["open_loop"]["scores"]["kv"]
    assert len(kv["psnr_db"]) == 2 and len(kv["ssim"]) == 2
    assert set(saved["open_loop"]["scores"]) == {"kv", "chained", "kv_shuffled_actions", "copy_first_frame",
                                                     "vae_reconstruction_ceiling"}
    assert len(saved["policy_ranking"]["sim_success"]) == 7
    for name in ("psnr.png", "ssim.png", "object_error.png", "policy_success.png", "rollouts_sim_kv_chained.mp4"):
        assert (tmp_path / name).stat().st_size > 0
    assert report["targets"]["psnr_window1_db"]["met"] is False  # random weights must not pass
