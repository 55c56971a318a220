"""Dataclass-to-flags (`worldstep.flags`): one mechanism for every command; the training run's flags keep their
spelling and defaults, and a run started before keeps resuming."""

from __future__ import annotations

import ast
import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from worldstep.flags import add_flags, flag, parse_flags, positive_int
from worldstep.train.args import STRETCH_ARGS, TrainArgs, check_resume_args, parse_args
from worldstep.train.loop import start_log

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "pusher5_args.json"  # args.json of a run started before

# every flag of `python -m worldstep.train` as the Makefile, docs and running jobs spell it
TRAIN_FLAGS = ("--out", "--budget-minutes", "--seed", "--resume", "--num-clips", "--windows", "--chunk",
               "--context-frames", "--vae-share", "--vae-batch", "--vae-long-share", "--vae-long-frames", "--vae-lr",
               "--dyn-batch", "--dyn-lr", "--ema", "--context-noise", "--own-context-share", "--moving-weight",
               "--vae-latent-noise", "--ckpt-every", "--encode-clips", "--log-every", "--vae-steps", "--dyn-steps",
               "--threads", "--dagger-clips", "--dagger-checkpoint", "--stop-after-minutes", "--small", "--vae-init",
               "--init-from", "--own-windows", "--own-rollouts", "--context-level", "--refresh-every", "--own-targets",
               "--export-only")
# flags added after the fixture's run started (the self-forcing phase); their defaults compute what it computed
ADDED_SINCE = ("init_from", "own_windows", "own_rollouts", "context_level", "refresh_every", "own_targets")
# every flag of the `worldstep` subcommands as spelled before they were generated from dataclasses
MODEL = ("--config", "--device", "--env", "--set")
VIEW = ("--rerun", "--rerun-save", "--rerun-serve")
CLI_FLAGS = {
    "rollout": (*MODEL, *VIEW, "--domain-id", "--embodiment", "--image", "--out", "--policy", "--prompt", "--quiet",
                "--seed", "--success", "--summary", "--truth", "--windows"),
    "eval": (*MODEL, *VIEW, "--batch-size", "--batched", "--no-video", "--out-dir", "--policy", "--quiet", "--ray",
             "--ray-address", "--seed", "--success", "--workers"),
    "plan": (*MODEL, *VIEW, "--approach-weight", "--candidates", "--compare", "--observe", "--out", "--proposal",
             "--seed", "--summary", "--windows"),
    "info": (*MODEL, "--context-frames", "--json", "--text-tokens", "--windows"),
    "stats": ("--column", "--dims", "--json", "--key", "--out"),
    "serve": (*MODEL, "--host", "--idle-timeout-s", "--max-batch", "--max-message-bytes", "--max-sessions",
              "--max-wait-ms", "--port", "--send-buffer-bytes", "--send-timeout-s", "--session-grace-s", "--tls-cert",
              "--tls-key", "--token-file"),
}


@dataclass
class Knobs:
    """Knobs of a test command."""

    name: str
    """what to call it"""
    steps: int = 4
    """denoise steps"""
    scale: float | None = None
    fast: bool = True
    sizes: list[int] = flag("numbers of sessions", default_factory=lambda: [1, 2])
    mode: str = flag("how", default="kv", choices=("kv", "dense"))
    workers: int = flag("processes", default=1, type=positive_int)


def test_fields_become_flags_with_their_types_defaults_and_help(capsys):
    knobs = parse_flags(Knobs, ["--name", "a"])
    assert knobs == Knobs(name="a")
    knobs = parse_flags(Knobs, ["--name", "b", "--steps", "2", "--scale", "0.5", "--no-fast", "--sizes", "4,8",
                                "--mode", "dense", "--workers", "3"])
    assert knobs == Knobs("b", 2, 0.5, False, [4, 8], "dense", 3)
    assert parse_flags(Knobs, ["--name", "c", "--sizes", ""]).sizes == []
    with pytest.raises(SystemExit):
        parse_flags(Knobs, ["--name", "a", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--steps STEPS denoise steps (default 4)" in text
    assert "--sizes SIZES numbers of sessions (default 1,2)" in text
    assert "--name NAME what to call it" in text and "--fast, --no-fast" in text
    for argv, word in ((["--steps", "2"], "--name"), (["--name", "a", "--sizes", "1,x"], "--sizes"),
                       (["--name", "a", "--mode", "sparse"], "--mode"),
                       (["--name", "a", "--workers", "0"], "--workers"),
                       (["--name", "a", "--stepz", "1"], "--stepz")):
        with pytest.raises(SystemExit):
            parse_flags(Knobs, argv)
        assert word in capsys.readouterr().err, argv  # the error names the flag at fault


def test_train_flags_keep_their_spelling_and_defaults():
    import argparse

    parser = argparse.ArgumentParser()
    add_flags(parser, TrainArgs)
    spelled = {s for action in parser._actions for s in action.option_strings if not s.startswith("--no-")}
    assert spelled - {"-h", "--help"} == set(TRAIN_FLAGS)
    saved = json.loads(FIXTURE.read_text())
    fields = [f.name for f in dataclasses.fields(TrainArgs)]
    assert list(saved) == [f for f in fields if f not in ADDED_SINCE]  # args.json's fields, in order
    assert check_resume_args(parse_args(["--out", "runs/pusher5", "--stop-after-minutes", "145"]), saved) is None
    defaults = dataclasses.asdict(parse_args([]))
    # the run was started with --out runs/pusher5 --stop-after-minutes 145 and every other default
    assert {k: v for k, v in saved.items() if defaults[k] != v} == {"out": "runs/pusher5", "stop_after_minutes": 145.0}
    assert parse_args(["--resume", "--small"]).resume and parse_args(["--small"]).small  # still bare switches


def test_cli_flags_keep_their_spelling_and_meaning():
    import argparse

    from worldstep.cli import build_parser
    from worldstep.view.viewer import DEFAULT_WEB_PORT

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, flags in CLI_FLAGS.items():
        spelled = {s for a in commands[name]._actions for s in a.option_strings}
        assert set(flags) <= spelled, (name, set(flags) - spelled)
    parse = build_parser().parse_args
    args = parse(["eval", "eps.yaml", "--no-video", "--set", "a=1", "--set", "b=2", "--rerun-serve"])
    assert args.episodes == "eps.yaml" and args.video is False and args.set == ["a=1", "b=2"]
    assert args.rerun_serve == DEFAULT_WEB_PORT and args.workers == 2 and args.env == "worldstep/Tiny-v0"
    args = parse(["plan", "--observe", "simulator", "--candidates", "3"])
    assert args.env == "worldstep/Pusher-v0" and args.policy == "planner" and args.candidates == 3
    assert parse(["stats", "a.npy", "--dims", "0:3"]).source == "a.npy"
    for argv in (["rollout", "--env", "worldstep/Tiny-v0", "--config", "tiny"], ["rollout", "--windows", "0"],
                 ["plan", "--observe", "dreams"]):
        with pytest.raises(SystemExit):
            parse(argv)


def test_a_run_started_before_resumes(tmp_path):
    shutil.copy(FIXTURE, tmp_path / "args.json")
    args = parse_args(["--out", "runs/pusher5", "--resume", "--stop-after-minutes", "60", "--threads", "2"])
    log = start_log(args, tmp_path)  # the saved arguments match: no refusal
    assert json.loads(log.path.read_text().splitlines()[-1])["event"] == "resume"
    assert json.loads((tmp_path / "args.json").read_text()) == json.loads(FIXTURE.read_text())  # kept as it was
    with pytest.raises(ValueError, match="--dyn-lr 0.002 -> 0.001"):
        check_resume_args(parse_args(["--out", "runs/pusher5", "--resume", "--dyn-lr", "0.001"]),
                          json.loads(FIXTURE.read_text()))
    assert set(STRETCH_ARGS) <= {f.name for f in dataclasses.fields(TrainArgs)}


def flag_declarations(sources: dict[str, str]) -> dict[str, list[str]]:
    """Per module: the dataclass fields it also declares by hand as flags (`add_argument("--field-name")`), and
    whether it builds flags from `dataclasses.fields` itself (a second dataclass-to-flags mechanism)."""
    found: dict[str, list[str]] = {}
    for name, text in sources.items():
        tree = ast.parse(text)
        fields = {s.target.id for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                  for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
        adds = [c for c in calls if getattr(c.func, "attr", None) == "add_argument"]
        flags = {a.value for c in adds for a in c.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
        problems = sorted(f for f in fields if "--" + f.replace("_", "-") in flags)
        if adds and any(getattr(c.func, "attr", getattr(c.func, "id", None)) == "fields" for c in calls):
            problems.append("dataclasses.fields -> add_argument")
        if problems:
            found[name] = problems
    return found


def test_one_dataclass_to_flags_mechanism():
    sources = {str(p.relative_to(ROOT)): p.read_text() for folder in ("sdk", "examples", "envs", "engine")
               for p in (ROOT / folder).rglob("*.py")}
    assert flag_declarations(sources) == {"sdk/flags.py": ["dataclasses.fields -> add_argument"]}
    by_hand = {a.value for text in sources.values() for c in ast.walk(ast.parse(text)) if isinstance(c, ast.Call)
               and getattr(c.func, "attr", None) == "add_argument" for a in c.args if isinstance(a, ast.Constant)}
    assert by_hand == {"--version"}  # every other flag comes from a dataclass field
    # a module that declares a field twice, or turns fields into flags its own way, is caught
    sources["sdk/train/args.py"] += '\n\nparser.add_argument("--dyn-lr", type=float)\n'
    sources["sdk/bench/cli.py"] += ("\n\nfor f in dataclasses.fields(cls):\n"
                                    "    parser.add_argument('--' + f.name)\n")
    found = flag_declarations(sources)
    assert found["sdk/train/args.py"] == ["dyn_lr"]
    assert found["sdk/bench/cli.py"] == ["dataclasses.fields -> add_argument"]
