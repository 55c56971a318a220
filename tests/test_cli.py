"""The worldstep CLI: rollout, eval, info, bench and error reporting."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import av
import numpy as np
import pytest
import yaml
from tiny_world import cache_dir, world  # noqa: F401 - fixtures
from worldstep import load_config as worldstep_config
from worldstep.cli import build_parser, main

FAST = ["--set", "height=32", "--set", "width=32", "--set", "num_steps=1", "--device", "cpu"]


def test_rollout_writes_mp4_and_summary(world, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "rollout.mp4"
    rc = main(["rollout", "--env", "worldstep/Tiny-v0", "--policy", "random", "--windows", "2", "--out", str(out),
               "--seed", "3", "--quiet", *FAST])
    assert rc == 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["windows"] == 2 and summary["frames"] == 8 and summary["policy"] == "random"
    with av.open(str(out)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 1 + 8
    assert "8 frames in 2 windows" in capsys.readouterr().out
    assert world.model.kv.num_used_pages == 0


def test_rollout_replay_policy(world, tmp_path):  # noqa: F811
    import numpy as np

    actions = tmp_path / "a.npy"
    np.save(actions, np.zeros((1, 4, 10), np.float32))  # droid_lerobot (tiny.yaml: domain 8)
    assert main(["rollout", "--policy", f"replay:{actions}", "--windows", "1", "--out", str(tmp_path / "r.mp4"),
                 "--quiet", *FAST]) == 0


def test_eval_from_yaml(world, tmp_path):  # noqa: F811
    episodes = tmp_path / "episodes.yaml"
    episodes.write_text(yaml.safe_dump({"episodes": [{"seed": 1, "max_windows": 1},
                                                     {"seed": 2, "prompt": "pick up the red cube", "max_windows": 1}]}))
    out = tmp_path / "eval"
    assert main(["eval", str(episodes), "--out-dir", str(out), "--batched", "--quiet", *FAST]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["num_episodes"] == 2 and report["batched"]
    assert sorted(p.name for p in out.glob("*.mp4")) == ["episode-000.mp4", "episode-001.mp4"]


def test_info_prints_the_memory_plan(world, capsys):  # noqa: F811
    assert main(["info", "--json", "--windows", "8", *FAST]) == 0
    info = json.loads(capsys.readouterr().out)
    memory = info["memory"]
    assert info["loaded"] and info["device"] == "cpu"
    assert "@ 15 fps" in info["frame"]  # the env's (droid_lerobot's) fps, as its videos play, not the base 24
    weights = sum(t.numel() * t.element_size() for m in (world.model.transformer, world.model.vae)
                  for t in [*m.parameters(), *m.buffers()])
    assert info["weights"]["total_bytes"] == weights and info["weights"]["measured"]
    assert memory["kv_bytes_per_token"] == world.model.kv_bytes_per_token
    assert memory["page_size"] == 16 and memory["num_pages"] == 512 and memory["text_tokens_measured"]
    assert memory["peak_pages_per_episode"] > 0


def test_info_without_weights_plans_from_the_architecture(tmp_path, capsys):
    assert main(["info", "--config", "cosmos3_edge", "--set", f"checkpoint={tmp_path / 'none'}",
                 "--set", "dtype=bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint not loaded" in out and "KV bytes per token      114688" in out
    assert "weights (bfloat16, estimated from model.architecture)" in out and "device: cpu" in out
    import re

    transformer_gib = float(re.search(r"transformer\s+([\d.]+) GiB", out).group(1))
    assert 5.0 < transformer_gib < 8.0  # Cosmos3-Edge's transformer: about 3.4 B parameters in bf16


def test_errors_name_the_key(capsys):
    assert main(["rollout", "--set", "num_steps=0"]) == 2
    assert "rollout.num_steps = 0: must be >= 1" in capsys.readouterr().err
    assert main(["rollout", "--set", "num_stepz=1"]) == 2
    err = capsys.readouterr().err
    assert "num_stepz: unknown key" in err and "did you mean 'rollout.num_steps'?" in err
    assert main(["rollout", "--policy", "nope", *FAST]) == 2
    assert "policy='nope'" in capsys.readouterr().err


def test_bench_subcommand_exists():
    assert "bench" in build_parser()._subparsers._group_actions[0].choices


def test_console_script_help():
    exe = os.path.join(os.path.dirname(sys.executable), "worldstep")
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "rollout" in proc.stdout and "info" in proc.stdout


@pytest.mark.parametrize("flags", [["--windows", "x"], ["--env", "CartPole-v1"]])
def test_argparse_rejects_bad_flags(flags):
    with pytest.raises(SystemExit):
        main(["rollout", *flags])


# --- checks before loading, one-line errors ----------------------------------------------------------

EDGE = ["--config", "cosmos3_edge"]  # no weights on this machine: a check that runs after loading never runs


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    rc = main(args)
    err = capsys.readouterr().err
    return rc, err


@pytest.mark.parametrize(("flags", "message"), [
    (["--device", "cuda"], "model.device = 'cuda': CUDA is not available"),
    (["--image", "{tmp}/corrupt.png"], "corrupt.png' is invalid: it cannot be read"),
    (["--out", "{tmp}"], "--out='{tmp}' is invalid: it is a folder"),
    (["--policy", "replay:{tmp}/short.npy", "--windows", "3"], "holds 2 windows; --windows 3 is invalid"),
    (["--success", "sim"], "--success sim is invalid for config 'cosmos3-edge'"),
    (["--success", "no_such_module:judge"], "No module named 'no_such_module'"),
    (["--set", "rollout.num_stepz=2"], "rollout.num_stepz: unknown key (unexpected keyword argument 'num_stepz'; "
                                       "did you mean 'num_steps'?)"),
    (["--set", "bogus.key=2"], "'bogus.key' is not SECTION.KEY"),
])
def test_rollout_flags_are_checked_before_the_model_loads(flags, message, tmp_path, capsys):
    if not torch_has_cuda() or "cuda" not in flags:
        (tmp_path / "corrupt.png").write_bytes(b"not a png")
        np.save(tmp_path / "short.npy", np.zeros((2, 16, 10), np.float32))
        rc, err = run_cli(["rollout", *EDGE, *[f.format(tmp=tmp_path) for f in flags]], capsys)
        assert rc == 2 and message.format(tmp=tmp_path) in err, err
        assert len(err.strip().splitlines()) == 1, err
        assert "CheckpointNotFoundError" not in err and "not found" not in err


def torch_has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_missing_checkpoint_folder_says_it_does_not_exist(tmp_path, capsys):
    rc, err = run_cli(["rollout", "--config", str(tmp_path / "nothing-here")], capsys)
    assert rc == 2 and "nothing-here' does not exist" in err


def test_windows_zero_is_an_argument_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["rollout", "--windows", "0"])
    assert info.value.code == 2 and "--windows: 0 is invalid; allowed: an int >= 1" in capsys.readouterr().err


def test_eval_checks_episodes_before_loading(tmp_path, capsys):
    episodes = tmp_path / "episodes.yaml"
    episodes.write_text(yaml.safe_dump([{"seed": 1, "promt": "x"}]))
    rc, err = run_cli(["eval", str(episodes), *EDGE], capsys)
    assert rc == 2 and "episodes[0].promt: unknown key" in err and "did you mean 'prompt'?" in err
    rc, err = run_cli(["eval", str(tmp_path / "missing.yaml")], capsys)
    assert rc == 2 and "missing.yaml' does not exist" in err


def test_unexpected_errors_are_one_line_too(monkeypatch, capsys):
    def boom(args):
        raise RuntimeError("the engine broke\nsecond line")

    monkeypatch.setattr("worldstep.cli.command.cmd_info", boom)
    rc, err = run_cli(["info"], capsys)
    assert rc == 1 and err.count("\n") == 1 and "RuntimeError: the engine broke; second line" in err
    assert "WORLDSTEP_TRACEBACK=1" in err


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"worldstep {version('worldstep')}"


# --- what the runs record ------------------------------------------------------------------------------


def test_dotted_set_keys_and_the_summary_records_the_run(world, tmp_path):  # noqa: F811
    out = tmp_path / "r.mp4"
    assert main(["rollout", "--windows", "1", "--out", str(out), "--seed", "5", "--prompt", "open the drawer",
                 "--quiet", "--set", "model.height=32", "--set", "model.width=32", "--set", "rollout.num_steps=1",
                 "--device", "cpu"]) == 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["status"] == "ok" and summary["seed"] == 5 and summary["policy"] == "sine"
    assert summary["prompt"] == "open the drawer" and summary["domain_id"] == 8
    assert summary["set"] == {"model": {"height": 32, "width": 32}, "rollout": {"num_steps": 1}}
    assert summary["success_judge"] == "none" and summary["windows"] == 1
    assert world.model.kv.num_used_pages == 0


def judge_bright(frames) -> bool:
    """A --success module:function for the test below."""
    return bool(frames.mean() >= 0)


def test_success_module_function_ends_the_episode(world, tmp_path):  # noqa: F811
    out = tmp_path / "r.mp4"
    assert main(["rollout", "--windows", "3", "--out", str(out), "--quiet", "--success", "test_cli:judge_bright",
                 *FAST]) == 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["success"] and summary["terminated"] and summary["windows"] == 1
    assert summary["success_judge"] == "test_cli:judge_bright"


def test_eval_report_records_the_run_and_the_real_wall_time(world, tmp_path):  # noqa: F811
    import time

    episodes = tmp_path / "episodes.yaml"
    episodes.write_text(yaml.safe_dump([{"seed": 1, "max_windows": 2}, {"seed": 2, "max_windows": 2}]))
    started = time.perf_counter()
    assert main(["eval", str(episodes), "--out-dir", str(tmp_path / "ev"), "--batched", "--quiet", "--no-video",
                 "--policy", "random", "--set", "num_pages=256", *FAST]) == 0
    elapsed = time.perf_counter() - started
    report = json.loads((tmp_path / "ev" / "report.json").read_text())
    assert report["status"] == "ok" and report["windows_completed"] == 4
    assert report["run"]["policy"] == "random" and report["run"]["set"]["num_pages"] == 256
    prompt = worldstep_config("tiny").env.prompt
    assert [(e["prompt"], e["domain_id"]) for e in report["episodes"]] == [(prompt, 8), (prompt, 8)]
    # batched episodes overlap: the run's wall time is not their sum
    assert max(e["wall_s"] for e in report["episodes"]) <= report["total_wall_s"] <= elapsed


def test_truth_video_is_labelled(tmp_path, cache_dir):  # noqa: F811
    out = tmp_path / "t.mp4"
    assert main(["rollout", "--env", "worldstep/Pusher-v0", "--policy", "push", "--windows", "1", "--truth",
                 "--out", str(out), "--quiet"]) == 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["simulator"] == "worldstep/PushSim-v0" and len(summary["psnr_db"]) == 1
    assert set(summary["worlds"]) == {"model", "simulator"}  # each world's first success window and final state
    assert {"success_window", "final_success", "ended"} <= set(summary["worlds"]["simulator"])
    from worldstep.envs.video import read_video
    from worldstep.truth import HEADER_PX

    frames = read_video(out)
    assert frames.shape == (5, HEADER_PX + 64 * 4, (2 * 64 + 2) * 4, 3)
    header = frames[:, :HEADER_PX].astype(int)
    assert (header[:, :, : 64 * 4] > 128).any() and (header[:, :, 66 * 4 :] > 128).any()  # both halves named
    assert not np.array_equal(header[0], header[-1])  # the caption changes: first frame, then window 0 and its PSNR


def test_eval_on_pusher_judges_success_with_its_simulator(tmp_path, cache_dir):  # noqa: F811
    """The headline bug: `eval --env worldstep/Pusher-v0 --policy push` reported 0% on every episode."""
    import gymnasium as gym
    from worldstep.policies import make_policy

    # rule: the first seed from 0 where the push expert succeeds in the simulator within 7 windows
    sim = gym.make("worldstep/PushSim-v0", disable_env_checker=True).unwrapped
    expert = make_policy("push", sim.action_space)
    for seed in range(50):
        obs, _ = sim.reset(seed=seed)
        expert.reset(seed)
        first = obs["frames"][0]
        if any(sim.success_from_frames(first, (obs := sim.step(expert(obs))[0])["frames"]) for _ in range(7)):
            break
    episodes = tmp_path / "episodes.yaml"
    episodes.write_text(yaml.safe_dump([{"seed": seed, "max_windows": 12}]))
    assert main(["eval", str(episodes), "--env", "worldstep/Pusher-v0", "--policy", "push", "--no-video", "--quiet",
                 "--out-dir", str(tmp_path / "ev")]) == 0
    report = json.loads((tmp_path / "ev" / "report.json").read_text())
    assert report["run"]["success_judge"] == "sim"
    # measured: seed 2, the simulator's expert succeeds at window 7 and the model's at window 9
    assert report["success_rate"] == 1.0 and report["episodes"][0]["terminated"], report["episodes"]
