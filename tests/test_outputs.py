"""Outputs a person can trust: videos and JSON appear whole or not at all, Ctrl-C leaves a summary that says
so, and an episode without ``max_windows`` runs the config's length."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import worldstep
from tiny_world import FAST, cache_dir, world  # noqa: F401 - fixtures
from worldstep.envs import Mp4Writer
from worldstep.envs.video import read_video
from worldstep.outputs import write_json
from worldstep.policies import SinePolicy

FRAME = np.full((16, 16, 3), 100, np.uint8)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".partial"))


def test_mp4_appears_only_when_closed(tmp_path):
    path = tmp_path / "v.mp4"
    writer = Mp4Writer(path, 24)
    writer.write(np.stack([FRAME] * 3))
    assert not path.exists()  # still being written, under a temporary name
    writer.close()
    assert read_video(path).shape == (3, 16, 16, 3) and not leftovers(tmp_path)


def test_an_aborted_mp4_leaves_the_previous_file(tmp_path):
    path = tmp_path / "v.mp4"
    path.write_bytes(b"the previous run")
    with pytest.raises(KeyboardInterrupt), Mp4Writer(path, 24) as writer:
        writer.write(FRAME)
        raise KeyboardInterrupt
    assert path.read_bytes() == b"the previous run" and not leftovers(tmp_path)


def test_write_json_is_atomic_and_strict(tmp_path, monkeypatch):
    path = tmp_path / "s.json"
    write_json(path, {"a": float("nan"), "b": [1.5, float("inf")]})
    assert json.loads(path.read_text()) == {"a": None, "b": [1.5, None]}

    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(KeyboardInterrupt):
        write_json(path, {"a": 2})
    assert json.loads(path.read_text())["a"] is None and not leftovers(tmp_path)


class InterruptingPolicy(SinePolicy):
    """Ctrl-C arrives during the policy's call after ``after`` windows."""

    def __init__(self, shape, after: int) -> None:
        super().__init__(shape)
        self.after, self.calls = after, 0

    def __call__(self, obs):
        self.calls += 1
        if self.calls > self.after:
            raise KeyboardInterrupt
        return super().__call__(obs)


def test_interrupted_evaluate_writes_a_report_that_says_so(world, tmp_path):  # noqa: F811
    (tmp_path / "episode-001.mp4").write_bytes(b"previous")
    policy = InterruptingPolicy(world.action_shape, after=3)
    with pytest.raises(KeyboardInterrupt):
        worldstep.evaluate(world, policy, [{"seed": 0, "max_windows": 2}, {"seed": 1, "max_windows": 4}],
                           out_dir=tmp_path, progress=False)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "interrupted" and report["windows_completed"] == 3
    assert [e["seed"] for e in report["episodes"]] == [0]  # the finished episode; the second was cut
    assert (tmp_path / "episode-000.mp4").is_file() and (tmp_path / "episode-001.mp4").read_bytes() == b"previous"
    assert not leftovers(tmp_path) and world.model.kv.num_used_pages == 0


def test_episode_without_max_windows_runs_the_configs_length(world, tmp_path):  # noqa: F811
    short = worldstep.load(world.config, max_windows=3)
    report = worldstep.evaluate(short, SinePolicy(short.action_shape), [{"seed": 0}], out_dir=tmp_path,
                                record_video=False, progress=False)
    assert report.episodes[0].windows == 3 and report.episodes[0].truncated
    env = worldstep.make_env(short, max_windows=2)  # an env's own max_windows is the default for its episodes
    report = worldstep.evaluate(env, SinePolicy(short.action_shape), [{"seed": 0}], out_dir=tmp_path,
                                record_video=False, progress=False)
    env.close()
    assert report.episodes[0].windows == 2


def test_ctrl_c_during_rollout(tmp_path, cache_dir):  # noqa: F811
    """SIGINT to `worldstep rollout`: one line on stderr, exit 130, the previous mp4 untouched, and a summary
    marked interrupted with the windows completed."""
    out = tmp_path / "r.mp4"
    out.write_bytes(b"previous video")
    (tmp_path / "r.json").write_text('{"previous": true}')
    exe = os.path.join(os.path.dirname(sys.executable), "worldstep")
    # 1000 tiny windows took 10 s alone on the 2-core box, short enough that a test process starved by a second
    # suite could signal a rollout that had already finished; 100,000 cannot end (by truncation or by running out
    # of windows) before the signal, however fast or loaded the box
    cmd = [exe, "rollout", "--windows", "100000", "--out", str(out), "--quiet", "--device", "cpu",
           "--set=max_windows=100000", *[f"--set={k}={v}" for k, v in FAST.items()]]
    # a shell without job control starts background jobs with SIGINT ignored, and a child inherits that: give
    # the rollout the default disposition, as a terminal's Ctrl-C finds it
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "WORLDSTEP_CACHE": str(cache_dir)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300
        while not leftovers(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # the partial mp4 appears once the episode has been reset
        assert leftovers(tmp_path), proc.communicate(timeout=60)[1] if proc.poll() is not None else "no partial mp4"
        time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()  # still rolling out when the signal goes (stdout says how far)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # a failed assertion above leaves no rollout running on
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (stdout, stderr)
    assert len(stderr.strip().splitlines()) == 1 and "interrupted after" in stderr and "Traceback" not in stderr
    summary = json.loads((tmp_path / "r.json").read_text())
    assert summary["status"] == "interrupted" and summary["reason"] == "KeyboardInterrupt"
    assert 0 <= summary["windows_completed"] < 100_000 and summary["video"] is None
    assert f"interrupted after {summary['windows_completed']} windows" in stderr
    assert out.read_bytes() == b"previous video" and not leftovers(tmp_path)


def test_a_failing_rollout_leaves_an_interrupted_summary(world, tmp_path, monkeypatch):  # noqa: F811
    from worldstep.cli import main

    out = tmp_path / "r.mp4"
    calls = []

    def broken(self, obs):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("policy server went away")
        return np.zeros(self.shape, np.float32)

    monkeypatch.setattr(SinePolicy, "__call__", broken)
    rc = main(["rollout", "--windows", "3", "--out", str(out), "--quiet", "--device", "cpu",
               *[f"--set={k}={v}" for k, v in FAST.items()]])
    assert rc == 1
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["status"] == "failed" and "policy server went away" in summary["reason"]
    assert summary["windows_completed"] == 1 and not out.exists() and not leftovers(tmp_path)


def test_json_safe_writes_strict_json_of_numpy_scalars_and_undefined_values():
    """The one definition behind every report (the bench's, the fidelity harness's): NaN and inf become null, numpy
    scalars their Python numbers, recursively."""
    import json

    import numpy as np
    from worldstep.outputs import json_safe

    value = {"a": np.float32(1.5), "b": [np.int64(3), np.bool_(True), float("nan"), np.float64("inf")], "c": (2,)}
    assert json.dumps(json_safe(value), allow_nan=False) == '{"a": 1.5, "b": [3, true, null, null], "c": [2]}'
