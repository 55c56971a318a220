"""Long training runs go in stretches: a stretch checkpoints and exits, `--resume` goes on exactly."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from worldstep.train import main
from worldstep.train.stretches import Stretch

SMALL = ["--small", "--num-clips", "12", "--windows", "2", "--context-frames", "1", "--vae-steps", "4",
         "--vae-batch", "1", "--dyn-steps", "6", "--dyn-batch", "2", "--log-every", "1", "--ckpt-every", "1000",
         "--threads", "1", "--dagger-clips", "0"]


def _weights(path) -> dict[str, torch.Tensor]:
    out = {}
    for part in ("transformer", "vae"):
        for file in sorted((path / part).glob("*.safetensors")):
            out.update({f"{part}.{k}": v for k, v in load_file(file).items()})
    return out


def test_a_run_in_stretches_equals_the_straight_run_bit_for_bit(tmp_path, monkeypatch):
    straight = main(["--out", str(tmp_path / "straight"), *SMALL])

    ticks = {"n": 0}

    def every_third_step(self) -> bool:  # a stretch ends after every 3 steps of work, in both phases
        ticks["n"] += 1
        return ticks["n"] % 3 == 0

    monkeypatch.setattr(Stretch, "expired", every_third_step)
    out = tmp_path / "stretches"
    assert main(["--out", str(out), *SMALL, "--stop-after-minutes", "5"]) is None
    path, stretches = None, 1
    while path is None:
        assert stretches < 10
        path = main(["--out", str(out), *SMALL, "--stop-after-minutes", "5", "--resume"])
        stretches += 1
    assert stretches >= 3  # it stopped in the VAE phase and in the dynamics phase
    ends = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert {r["phase"] for r in ends if r.get("event") == "stretch_end" and "phase" in r} == {"vae", "dynamics"}
    a, b = _weights(straight), _weights(path)
    assert a.keys() == b.keys() and len(a) > 10
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_resume_refuses_changed_arguments_and_names_them(tmp_path, monkeypatch):
    monkeypatch.setattr(Stretch, "expired", lambda self: True)
    out = tmp_path / "run"
    assert main(["--out", str(out), *SMALL, "--stop-after-minutes", "5"]) is None
    changed = [*SMALL, "--dyn-lr", "1e-2", "--seed", "7"]
    with pytest.raises(ValueError, match=r"--dyn-lr 0\.002 -> 0\.01.*--seed 0 -> 7"):
        main(["--out", str(out), *changed, "--resume"])
    # what only sets how a stretch runs may change
    assert main(["--out", str(out), *SMALL, "--resume", "--threads", "2", "--stop-after-minutes", "9"]) is None


def test_stretch_and_dagger_arguments_are_checked():
    from worldstep.train.args import parse_args

    with pytest.raises(ValueError, match="stop-after-minutes=-1"):
        parse_args(["--stop-after-minutes", "-1"])
    with pytest.raises(ValueError, match="dagger-clips=5000"):
        parse_args(["--dagger-clips", "5000"])


def test_training_mixture_covers_every_kind_and_every_graded_policy():
    import numpy as np
    from worldstep.train.data import CLIP_KINDS, CLIP_MIX, mixture_seeds, training_clips

    clips, kinds = training_clips(60, 8, seed=3)
    assert set(np.unique(kinds).tolist()) == {CLIP_KINDS.index(k) for k in CLIP_MIX}
    assert np.array_equal(clips.seeds, mixture_seeds(60, 3))
    again, _ = training_clips(60, 8, seed=3)
    assert np.array_equal(clips.actions, again.actions) and np.array_equal(clips.starts, again.starts)
    contact = clips.starts[kinds == CLIP_KINDS.index("contact")]
    gap = np.abs(contact[:, 0] - contact[:, 1]).max(axis=1)  # effector against the block, any angle
    assert (gap <= 12.1).all()
    with pytest.raises(ValueError, match="mix="):
        training_clips(4, 8, seed=0, mix={"expert": 1.0})
