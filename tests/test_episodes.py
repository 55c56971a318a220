"""One per-episode result (`EpisodeResult`): the truth comparison, the planner's closed loop and the fidelity
report's episodes hold one and add their own fields; their record formats are unchanged."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
from worldstep.episodes import EpisodeResult
from worldstep.fidelity.records import Records, read_records, write_records
from worldstep.fidelity.rollouts import EpisodeOutcome
from worldstep.planning import ClosedLoopResult
from worldstep.truth import TruthComparison, WorldRecord

SDK = Path(__file__).resolve().parents[1] / "sdk"

# a planning.jsonl row and an episodes.jsonl row as the report writes them (actions: float32 values)
PLAN_ROW = {"seed": 20000000, "policy": "planner", "observe": "model", "windows": 2, "model_success": True,
            "sim_success": False, "actions": [[[0.5, -0.25]], [[0.75, 0.125]]], "stop": "believed_success",
            "anchor_every": None, "cost_rank_correlation": [0.5, None],
            "window_success": [[True, False], [True, False]], "stop_rule_sha256": None, "window_trust": []}
EPISODE_ROW = {"policy": "expert", "seed": 20000001, "success": True, "windows": 1, "replay_success": False,
               "actions": [[[0.5, 0.5]]], "stop": "success",
               "detections": [{"model": {"effector": [1.0, 2.0], "block": None}, "sim": None,
                               "model_success": True, "sim_success": False}]}


def test_record_rows_round_trip_in_their_saved_format(tmp_path):
    records = Records(episodes=[EpisodeOutcome.from_record(EPISODE_ROW)],
                      plans=[ClosedLoopResult.from_record(PLAN_ROW)])
    write_records(tmp_path, records)
    folder = tmp_path / "records"
    episode_line = json.loads((folder / "episodes.jsonl").read_text())
    plan_line = json.loads((folder / "planning.jsonl").read_text())
    assert list(episode_line) == ["world", *EPISODE_ROW] and episode_line == {"world": "model", **EPISODE_ROW}
    assert list(plan_line) == list(PLAN_ROW) and plan_line == PLAN_ROW
    again = read_records(tmp_path)
    assert again.episodes[0].to_record() == EPISODE_ROW and again.plans[0].to_record() == PLAN_ROW
    assert again.plans[0].sim_success is False and again.episodes[0].episode.success is True
    older = {k: v for k, v in PLAN_ROW.items() if k not in ("stop_rule_sha256", "window_trust")}
    assert ClosedLoopResult.from_record(older).to_record() == PLAN_ROW  # a record from before the selective stop


def test_extensions_hold_the_common_result_and_report_it_flat():
    episode = EpisodeResult(index=0, seed=3, windows=2, frames=8, success=True, video="x.mp4")
    truth = TruthComparison(episode, psnr_db=[20.0, 22.0], model=WorldRecord(success_window=1, final_success=False))
    flat = truth.to_dict()
    assert flat["windows"] == 2 and flat["frames"] == 8 and flat["video"] == "x.mp4" and flat["seed"] == 3
    assert flat["truth_success"] is True and flat["model_success"] is False and flat["mean_psnr_db"] == 21.0
    assert flat["worlds"]["model"]["success_window"] == 1 and flat["worlds"]["model"]["final_success"] is False
    plan = ClosedLoopResult(episode, "planner", actions=[np.zeros((4, 2), np.float32)])
    flat = plan.to_dict()
    assert flat["sim_success"] is True and flat["windows"] == 2 and flat["actions"] == [[[0.0, 0.0]] * 4]
    assert set(EpisodeResult(index=0, seed=0).to_dict()) <= set(flat)


def per_episode_results(sources: dict[str, str]) -> list[str]:
    """Dataclasses that declare an episode's own fields: its `seed`, its `windows` and a success verdict (a bool)."""
    found = []
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(d, (ast.Name, ast.Call, ast.Attribute)) and "dataclass" in ast.unparse(d)
                    for d in node.decorator_list):
                fields = {s.target.id: ast.unparse(s.annotation) for s in node.body
                          if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
                if {"seed", "windows"} <= set(fields) and any("success" in n and "bool" in kind
                                                             for n, kind in fields.items()):
                    found.append(f"{name}:{node.name}")
    return found


def test_one_per_episode_result_type():
    sources = {str(p.relative_to(SDK)): p.read_text() for p in SDK.rglob("*.py")}
    assert per_episode_results(sources) == ["episodes.py:EpisodeResult"]
    # the check sees a second one (a copy of the fields instead of a composed record)
    sources["planning.py"] += ("\n\n@dataclass\nclass Copy:\n    seed: int\n    windows: int = 0\n"
                               "    sim_success: bool = False\n")
    assert per_episode_results(sources) == ["episodes.py:EpisodeResult", "planning.py:Copy"]
