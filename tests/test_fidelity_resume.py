"""`--resume`: a fidelity run killed midway and resumed writes the same records and report as one that was not."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
from worldstep.fidelity import tasks
from worldstep.fidelity.journal import Journal, task_key
from worldstep.fidelity.report import main

ARGV = ["--budget", "small", "--threads", "1", "--sections", "openloop,policies,planning", "--continue-windows", "1",
        "--agreement-forks", "1"]
PATCHED = (tasks.OpenLoopTask, tasks.ReconstructTask, tasks.EpisodesTask, tasks.PlannerTask)


class Killed(BaseException):
    """Stands for the process being killed (a BaseException, as KeyboardInterrupt is: nothing catches it)."""


def _count_runs(monkeypatch, kill_at: int | None = None) -> list:
    """Record every task run; raise `Killed` instead of running task number `kill_at`."""
    ran: list = []
    for cls in PATCHED:
        original = cls.run

        def run(self, worker, _original=original):
            if kill_at is not None and len(ran) == kill_at:
                raise Killed
            ran.append(task_key(self))
            return _original(self, worker)

        monkeypatch.setattr(cls, "run", run)
    return ran


def _figures(out) -> dict:
    report = json.loads((out / "report.json").read_text())
    return {k: v for k, v in report.items() if k not in ("seconds", "provenance", "args", "checkpoint", "files")}


def test_a_killed_run_resumed_equals_an_uninterrupted_one(tmp_path, monkeypatch):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    ran_whole = _count_runs(monkeypatch)
    main([*ARGV, "--out", str(whole)])
    monkeypatch.undo()
    total = len(ran_whole)
    assert total > 6

    ran_cut = _count_runs(monkeypatch, kill_at=5)
    with pytest.raises(Killed):
        main([*ARGV, "--out", str(cut)])
    assert not (cut / "report.json").exists() and len(ran_cut) == 5
    monkeypatch.undo()

    ran_resumed = _count_runs(monkeypatch)
    main([*ARGV, "--out", str(cut), "--resume"])
    assert len(ran_resumed) == total - 5  # the five finished tasks are not run again
    assert not set(ran_resumed) & set(ran_cut)
    for name in ("episodes.jsonl", "planning.jsonl", "openloop.jsonl"):
        assert (cut / "records" / name).read_text() == (whole / "records" / name).read_text(), name
    assert _figures(cut) == _figures(whole)
    rows = [json.loads(r) for r in (cut / "records" / "episodes.jsonl").read_text().splitlines()]
    model = [r for r in rows if r["world"] == "model"]
    assert all(len(d["forks"]) == 1 for r in model for d in r["detections"])
    assert all(len(r.get("continued", [])) == (1 if r["stop"] == "success" else 0) for r in model)


def test_a_run_without_resume_starts_afresh_and_resume_refuses_changed_arguments(tmp_path, monkeypatch):
    settings = {"episodes": 2, "split": "validation"}
    journal = Journal(tmp_path, settings, resume=False)
    journal.put(tasks.EpisodesTask((0,), (1,), 2), ["done"])
    assert Journal(tmp_path, settings, resume=True).has(tasks.EpisodesTask((0,), (1,), 2))
    assert not Journal(tmp_path, settings, resume=True).has(tasks.EpisodesTask((0,), (1,), 3))
    with pytest.raises(ValueError, match="episodes: 2 -> 3"):
        Journal(tmp_path, {**settings, "episodes": 3}, resume=True)
    assert not Journal(tmp_path, settings, resume=False).has(tasks.EpisodesTask((0,), (1,), 2))


def test_a_spent_stretch_writes_no_report_and_the_next_one_finishes(tmp_path, monkeypatch):
    argv = ["--budget", "small", "--threads", "1", "--sections", "policies", "--out", str(tmp_path)]
    monkeypatch.setattr(tasks, "_spent", lambda deadline: deadline is not None)  # spent from the start
    stopped = main([*argv, "--stop-after-minutes", "1"])
    assert "task(s) left" in stopped["stopped"] and not (tmp_path / "report.json").exists()
    monkeypatch.undo()
    assert "policies" in main([*argv, "--resume"])


class SimWorld:
    """A stand-in world model that is the simulator itself (sessions are PushSim envs; forks copy them)."""

    def __init__(self) -> None:
        self.open, self.forks = set(), 0

    def open_session(self, frame, prompt, domain_id, knobs=None, generator=None, action_width=2):
        from worldstep.envs.push_sim import PushSimEnv

        sim = PushSimEnv(chunk_size=4)
        sim.reset(seed=int(generator.initial_seed()) // 1000)  # noise_seed(seed, p) = 1000 * seed + p
        self.open.add(id(sim))
        return sim

    def fork(self, session, generator=None):
        fork = copy.deepcopy(session)
        self.open.add(id(fork))
        self.forks += 1
        return fork

    def step(self, sessions, chunks):
        return [SimpleNamespace(frames=s.step(c)[0]["frames"]) for s, c in zip(sessions, chunks)]

    def close(self, session):
        self.open.discard(id(session))


def test_continued_windows_and_forks_are_recorded_beside_unchanged_outcomes():
    from worldstep.engine.config import RolloutKnobs
    from worldstep.envs.push_policies import graded_policies
    from worldstep.fidelity.rollouts import model_episodes
    from worldstep.recipes.open_loop import RolloutRecipe

    recipe = RolloutRecipe("push", 0, RolloutKnobs(num_steps=1))
    expert = graded_policies(4)[:1]
    seeds = [20_000_000 + s for s in range(4)]
    world = SimWorld()
    plain = model_episodes(world, expert, seeds, 16, recipe)
    study = model_episodes(world, expert, seeds, 16, recipe, continue_windows=2, agreement_forks=2)
    assert not world.open and world.forks == 2 * sum(o.episode.windows + len(o.continued) for o in study)
    stopped = [o for o in study if o.stop == "success"]
    assert len(stopped) >= 2 and all(len(o.continued) == 2 for o in stopped)
    for a, b in zip(plain, study):
        row = b.to_record()
        row.pop("continued", None)
        for d in row["detections"]:
            assert d.pop("forks") == [d["model_success"]] * 2  # the simulator's forks always agree
        assert row == a.to_record()
    assert all(c["sim_success"] == c["model_success"] for o in stopped for c in o.continued)


def test_resume_refuses_another_commit_or_edited_code(tmp_path, monkeypatch):
    from worldstep.fidelity import provenance

    argv = ["--budget", "small", "--threads", "1", "--sections", "policies", "--out", str(tmp_path)]
    monkeypatch.setattr(tasks, "_spent", lambda deadline: deadline is not None)  # spent from the start
    main([*argv, "--stop-after-minutes", "1"])
    saved = json.loads((tmp_path / "journal" / "run.json").read_text())
    assert saved["git_commit"] == provenance.code_state()["git_commit"] and len(saved["code_sha256"]) == 64
    real = provenance.code_state
    for key in ("git_commit", "code_sha256"):
        monkeypatch.setattr(provenance, "code_state", lambda key=key: {**real(), key: "0" * 40})
        with pytest.raises(ValueError, match=f"{key}: "):
            main([*argv, "--resume"])
    monkeypatch.setattr(provenance, "code_state", real)
    monkeypatch.setattr(tasks, "_spent", lambda deadline: False)
    assert "policies" in main([*argv, "--resume"])


def test_the_journal_saves_results_as_json_and_arrays_and_reads_them_back_equal(tmp_path):
    import numpy as np
    from worldstep.episodes import EpisodeResult
    from worldstep.fidelity.rollouts import EpisodeOutcome
    from worldstep.planning import ClosedLoopResult

    journal = Journal(tmp_path, {"episodes": 2}, resume=False)
    frames = (np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4), np.full((2, 2), np.nan, np.float32))
    outcome = EpisodeOutcome(EpisodeResult(index=0, seed=7, windows=2, success=True), "expert", False,
                             [[[0.5, -1.0]]], "success", [{"model": {"block": None}, "sim": {"block": [1.5, 2.0]}}],
                             [{"sim_success": True, "actions": [[0.0, 1.0]]}])
    plan = ClosedLoopResult(EpisodeResult(index=0, seed=8, windows=1, success=False), "plan2", "model", True,
                            [np.array([[0.25, 1.0]], np.float32)], "claimed_success", None, [None],
                            [[True, False]], "ab" * 32, [{"window": 1, "consistency": float("inf")}])
    cases = [(tasks.OpenLoopTask(frames[0], frames[0], (1,)), frames), (tasks.EpisodesTask((0,), (7,), 2), [outcome]),
             (tasks.PlannerTask("noisy0.8", 2, (8,), 1, "model"), [plan])]
    for task, result in cases:
        journal.put(task, result)
    again = Journal(tmp_path, {"episodes": 2}, resume=True)
    got = again.get(cases[0][0])
    assert isinstance(got, tuple) and got[0].dtype == np.uint8 and np.array_equal(got[0], frames[0])
    assert got[1].dtype == np.float32 and np.isnan(got[1]).all()
    assert [e.to_record() for e in again.get(tasks.EpisodesTask((0,), (7,), 2))] == [outcome.to_record()]
    back = again.get(tasks.PlannerTask("noisy0.8", 2, (8,), 1, "model"))[0]
    assert json.dumps(back.to_record()) == json.dumps(plan.to_record())  # inf kept (a vanished block), not None
    assert not list((tmp_path / "journal").glob("*.pkl"))
    with pytest.raises(TypeError, match="set"):
        journal.put(tasks.EpisodesTask((1,), (7,), 2), {"x": {1, 2}})
