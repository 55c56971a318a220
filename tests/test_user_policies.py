"""A user's own policy: a plain function is a policy (both evaluation paths and the CLI), ``--policy
module:attr`` / ``path.py:attr`` load one, and a run whose every episode failed says so (report status,
exception, exit code) instead of scoring 0%."""

from __future__ import annotations

import json

import numpy as np
import pytest
import worldstep
from tiny_world import FAST, cache_dir, world  # noqa: F401 - fixtures
from worldstep.cli import main
from worldstep.episodes import EvaluationFailed

CLI_FAST = [f"--set={k}={v}" for k, v in FAST.items()]


def still(obs):
    """A plain function policy: obs -> actions (the tiny model's droid_lerobot chunk (4, 10))."""
    return np.zeros((4, 10), np.float32)


def broken(obs):
    raise RuntimeError("my policy is broken")


@pytest.mark.parametrize("batched", [False, True])
def test_a_plain_function_is_a_policy(world, tmp_path, batched):  # noqa: F811
    report = worldstep.evaluate(world, still, [{"seed": 1, "max_windows": 2}, {"seed": 2, "max_windows": 1}],
                                out_dir=tmp_path, batched=batched, progress=False)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["status"] == "ok" and data["num_failed"] == 0 and data["error"] is None
    assert [e.windows for e in report.episodes] == [2, 1] and data["policy"] == "FunctionPolicy"
    assert sorted(p.name for p in tmp_path.glob("*.mp4")) == ["episode-000.mp4", "episode-001.mp4"]


def test_what_is_not_a_policy_is_refused_before_the_first_episode(world, tmp_path):  # noqa: F811
    with pytest.raises(TypeError, match=r"policy=42 is invalid; allowed: a policy .* or a plain callable"):
        worldstep.evaluate(world, 42, 1, out_dir=tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("batched", [False, True])
def test_a_run_whose_episodes_all_failed_raises_after_writing_a_failed_report(world, tmp_path, capsys,  # noqa: F811
                                                                              batched):
    first = "all 2 episodes failed; first error: RuntimeError: my policy is broken"
    with pytest.raises(EvaluationFailed, match=first):
        worldstep.evaluate(world, broken, 2, out_dir=tmp_path, batched=batched, progress=False)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["status"] == "failed" and data["num_failed"] == 2
    assert data["error"] == "RuntimeError: my policy is broken"
    err = capsys.readouterr().err  # each failure is said as it happens, not only in the report
    assert "episode 0 (seed 0) failed: RuntimeError: my policy is broken" in err
    assert "episode 1 (seed 1) failed" in err
    assert not list(tmp_path.glob(".*partial"))  # the videos of what happened (the first frame) are kept


def test_one_failed_episode_of_several_keeps_the_run_ok(world, tmp_path):  # noqa: F811
    calls = []

    def second_fails(obs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("once")
        return still(obs)

    report = worldstep.evaluate(world, second_fails, [{"max_windows": 1}] * 3, out_dir=tmp_path, progress=False)
    assert [e.status for e in report.episodes] == ["ok", "failed", "ok"]
    assert json.loads((tmp_path / "report.json").read_text())["status"] == "ok"


POLICY_FILE = '''
import numpy as np

def act(obs):
    return np.full((4, 10), 0.25, np.float32)

class Still:
    def __init__(self, shape):
        self.shape = shape
    def reset(self, seed=None):
        pass
    def __call__(self, obs):
        return np.zeros(self.shape, np.float32)

def crash(obs):
    raise ValueError("crashed on purpose")
'''


@pytest.mark.parametrize("attr", ["act", "Still"])
def test_cli_rollout_and_eval_take_a_policy_from_a_file(world, tmp_path, attr):  # noqa: F811
    (tmp_path / "mine.py").write_text(POLICY_FILE)
    spec = f"{tmp_path / 'mine.py'}:{attr}"
    out = tmp_path / "r.mp4"
    assert main(["rollout", "--policy", spec, "--windows", "2", "--out", str(out), "--quiet", *CLI_FAST]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["windows"] == 2
    episodes = tmp_path / "episodes.yaml"
    episodes.write_text("- {seed: 1, max_windows: 1}\n- {seed: 2, max_windows: 1}\n")
    for batched in ([], ["--batched"]):
        out_dir = tmp_path / f"eval{len(batched)}"
        assert main(["eval", str(episodes), "--policy", spec, "--out-dir", str(out_dir), "--quiet", *batched,
                     *CLI_FAST]) == 0
        report = json.loads((out_dir / "report.json").read_text())
        assert report["status"] == "ok" and [e["windows"] for e in report["episodes"]] == [1, 1]


def test_cli_eval_takes_an_importable_module_attr(world, tmp_path):  # noqa: F811
    episodes = tmp_path / "episodes.yaml"
    episodes.write_text("- {seed: 1, max_windows: 1}\n")
    assert main(["eval", str(episodes), "--policy", "test_user_policies:still", "--out-dir", str(tmp_path / "e"),
                 "--quiet", *CLI_FAST]) == 0


def test_cli_eval_whose_episodes_all_failed_exits_non_zero(world, tmp_path, capsys):  # noqa: F811
    (tmp_path / "mine.py").write_text(POLICY_FILE)
    episodes = tmp_path / "episodes.yaml"
    episodes.write_text("- {seed: 1, max_windows: 1}\n- {seed: 2, max_windows: 1}\n")
    for batched in ([], ["--batched"]):
        out_dir = tmp_path / f"eval{len(batched)}"
        rc = main(["eval", str(episodes), "--policy", f"{tmp_path / 'mine.py'}:crash", "--out-dir", str(out_dir),
                   "--quiet", *batched, *CLI_FAST])
        err = capsys.readouterr().err
        assert rc == 1 and "all 2 episodes failed; first error: ValueError: crashed on purpose" in err, err
        assert json.loads((out_dir / "report.json").read_text())["status"] == "failed"


@pytest.mark.parametrize(("spec", "message"), [
    ("no_such_module_xyz:act", "No module named 'no_such_module_xyz'"),
    ("{tmp}/missing.py:act", "does not exist"),
    ("{tmp}/mine.py:nope", "has no attribute 'nope'"),
    ("{tmp}/mine.py:POLICY_FILE_CONSTANT", "is invalid; allowed: a policy"),
])
def test_cli_refuses_a_policy_it_cannot_load_before_the_model_loads(spec, message, tmp_path, capsys):
    (tmp_path / "mine.py").write_text(POLICY_FILE + "\nPOLICY_FILE_CONSTANT = 3\n")
    rc = main(["rollout", "--config", "cosmos3_edge", "--policy", spec.format(tmp=tmp_path),
               "--out", str(tmp_path / "r.mp4")])  # no Edge weights here: a check after loading never runs
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "--policy" in err, err
    assert len(err.strip().splitlines()) == 1


def test_an_unknown_policy_is_refused_before_torch_is_imported():
    """The error a typo gets needs no model code: counted by what was imported, not timed (before: torch loaded
    with the config first)."""
    import subprocess
    import sys

    code = ("import sys\nfrom worldstep.cli import main\n"
            "rc = main(['rollout', '--policy', 'nope', '--out', 'x.mp4'])\n"
            "print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["2", "False"], out.stdout + out.stderr
    assert "policy='nope' is invalid" in out.stderr
