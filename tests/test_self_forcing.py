"""Fine-tuning on the model's own rollouts (`--init-from`): context the model committed, targets the replay's."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from worldstep.train import main
from worldstep.train.stretches import Stretch

BASE = ["--small", "--num-clips", "12", "--windows", "2", "--context-frames", "1", "--vae-steps", "4",
        "--vae-batch", "1", "--dyn-steps", "6", "--dyn-batch", "2", "--log-every", "1", "--ckpt-every", "1000",
        "--threads", "1", "--dagger-clips", "0"]
TUNE = ["--own-windows", "2", "--own-rollouts", "4", "--dyn-steps", "6", "--refresh-every", "3", "--dyn-batch", "2",
        "--context-frames", "1", "--log-every", "1", "--ckpt-every", "1000", "--threads", "1"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A small trained checkpoint to fine-tune from."""
    return main(["--out", str(tmp_path_factory.mktemp("base") / "run"), *BASE])


def _transformer(path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted((path / "transformer").glob("*.safetensors")):
        out.update(load_file(file))
    return out


def test_fine_tune_trains_on_its_own_rollouts_and_refreshes_them(base, tmp_path):
    out = tmp_path / "ft"
    path = main(["--out", str(out), "--init-from", str(base), *TUNE])
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    made = [r for r in records if r.get("phase") == "own_rollouts"]
    assert [r["name"] for r in made] == ["own_held", "own_round0", "own_round1"]
    assert made[1]["checkpoint"] == str(base) and made[2]["checkpoint"] == str(out / "round_checkpoint")
    assert made[1]["seeds"][1] < made[2]["seeds"][0]  # a refresh draws new starts from the DAgger range
    assert len([r for r in records if r.get("phase") == "self_forcing" and "loss" in r]) == 6

    from worldstep.fidelity.seeds import DAGGER, VALIDATION
    from worldstep.train.self_forcing import OwnRollouts

    data = OwnRollouts.load(out / "own_round1.pt")
    assert all(int(s) in DAGGER and int(s) not in VALIDATION for s in data.clips.seeds)
    assert data.own.shape == data.true.shape and data.own.shape[2] == 1 + 2
    assert torch.allclose(data.own[:, :, 0], data.true[:, :, 0], atol=1e-4)  # the same first frame
    assert not torch.allclose(data.own[:, :, 1:], data.true[:, :, 1:], atol=1e-2)  # the model's own windows

    snap = main(["--out", str(out), "--init-from", str(base), *TUNE, "--export-only", str(tmp_path / "snap")])
    assert _transformer(snap).keys() == _transformer(path).keys()
    assert all(torch.equal(_transformer(snap)[k], v) for k, v in _transformer(path).items())  # the EMA it exported
    tuned, start = _transformer(path), _transformer(base)
    assert tuned.keys() == start.keys() and any(not torch.equal(tuned[k], start[k]) for k in tuned)
    vae = {f.name: load_file(f) for f in sorted((path / "vae").glob("*.safetensors"))}
    for name, weights in {f.name: load_file(f) for f in sorted((base / "vae").glob("*.safetensors"))}.items():
        assert all(torch.equal(weights[k], vae[name][k]) for k in weights)  # the VAE stays frozen


def test_own_latents_are_what_the_model_commits(base):
    from worldstep.engine.models.cosmos3 import RolloutKnobs
    from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel
    from worldstep.envs.push_sim import PushSimEnv
    from worldstep.train.dagger import model_loop
    from worldstep.train.pusher import DOMAIN_ID, PROMPT

    world = Cosmos3WorldModel.from_pretrained(base, device="cpu", page_size=4, num_pages=512)
    knobs = RolloutKnobs(num_steps=2, context_frames=1)
    clips, own = model_loop(world, [11, 12], 8, 4, PROMPT, DOMAIN_ID, knobs)
    obs, _ = PushSimEnv().reset(seed=12)
    session = world.open_session(obs["frames"][0], PROMPT, DOMAIN_ID, knobs=knobs,
                                 generator=torch.Generator().manual_seed(12), action_width=2)
    committed = [session.first_latent]
    for w in range(2):
        committed.append(world.step([session], [clips.actions[1, 4 * w:4 * (w + 1)]])[0].latents)
    world.close(session)
    assert torch.equal(own[1], torch.cat(committed, dim=1))
    assert world.kv.num_used_pages == 0  # every session of the loop came back


def test_a_fine_tune_in_stretches_equals_the_straight_one_bit_for_bit(base, tmp_path, monkeypatch):
    straight = main(["--out", str(tmp_path / "straight"), "--init-from", str(base), *TUNE])
    ticks = {"n": 0}

    def every_other_step(self) -> bool:
        ticks["n"] += 1
        return ticks["n"] % 2 == 0

    monkeypatch.setattr(Stretch, "expired", every_other_step)
    out, path, stretches = tmp_path / "stretches", None, 0
    args = ["--out", str(out), "--init-from", str(base), *TUNE, "--stop-after-minutes", "5"]
    while path is None:
        assert stretches < 10
        path = main(args + (["--resume"] if stretches else []))
        stretches += 1
    assert stretches >= 3
    a, b = _transformer(straight), _transformer(path)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_fine_tune_arguments_are_checked(tmp_path):
    from worldstep.train.args import parse_args

    with pytest.raises(ValueError, match="init-from='nowhere'"):
        parse_args(["--init-from", "nowhere"])
    with pytest.raises(ValueError, match="own-rollouts=0"):
        parse_args(["--own-rollouts", "0"])
    with pytest.raises(ValueError, match="context-level=1"):
        parse_args(["--context-level", "1"])
    with pytest.raises(ValueError, match="refresh-every=-1"):
        parse_args(["--refresh-every", "-1"])
    assert np.isfinite(parse_args(["--own-windows", "16"]).own_windows)


def test_a_fine_tune_with_context_noise_tells_the_model_its_level(base, tmp_path, monkeypatch):
    from worldstep.train.dynamics import DynamicsModel

    seen = []
    loss = DynamicsModel.loss

    def recording_loss(self, batch, context=None, context_level=None):
        if torch.is_grad_enabled():  # a training step (the held-out loss runs without grad)
            seen.append(None if context_level is None else context_level.clone())
        return loss(self, batch, context, context_level)

    monkeypatch.setattr(DynamicsModel, "loss", recording_loss)
    tune = [a if a != "6" else "3" for a in TUNE]
    assert main(["--out", str(tmp_path / "ft"), "--init-from", str(base), *tune, "--context-level", "0.2"]).exists()
    assert len(seen) == 3 and all(s is not None and s.shape == (2,) and (s >= 0).all() and (s < 0.2).all()
                                  for s in seen)
