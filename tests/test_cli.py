"""The worldstep CLI: rollout, eval, info, bench and error reporting."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import av
import pytest
import yaml
from tiny_world import cache_dir, world  # noqa: F401 - fixtures
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
    assert world.model.kv.table.num_used_pages == 0


def test_rollout_replay_policy(world, tmp_path):  # noqa: F811
    import numpy as np

    actions = tmp_path / "a.npy"
    np.save(actions, np.zeros((1, 4, 16), np.float32))
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
    assert memory["kv_bytes_per_token"] == world.model.kv_bytes_per_token
    assert memory["page_size"] == 16 and memory["num_pages"] == 512 and memory["text_tokens_measured"]
    assert memory["peak_pages_per_episode"] > 0


def test_info_without_weights_plans_from_the_architecture(tmp_path, capsys):
    assert main(["info", "--config", "cosmos3_edge", "--set", f"checkpoint={tmp_path / 'none'}",
                 "--set", "dtype=bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint not loaded" in out and "KV bytes per token      114688" in out


def test_errors_name_the_key(capsys):
    assert main(["rollout", "--set", "num_steps=0"]) == 2
    assert "rollout.num_steps = 0: must be >= 1" in capsys.readouterr().err
    assert main(["rollout", "--set", "num_stepz=1"]) == 2
    assert "num_stepz: unknown key" in capsys.readouterr().err
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
