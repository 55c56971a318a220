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

    from worldstep.envs.push_seeds import DAGGER, VALIDATION
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
    from worldstep.engine.config import RolloutKnobs
    from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel
    from worldstep.envs.push_sim import PushSimEnv
    from worldstep.train.dagger import model_loop
    from worldstep.train.pusher import DOMAIN_ID, PROMPT

    world = Cosmos3WorldModel.from_pretrained(base, device="cpu", page_size=4, num_pages=512)
    knobs = RolloutKnobs(num_steps=2, context_frames=1)
    clips, own, frames = model_loop(world, [11, 12], 8, 4, PROMPT, DOMAIN_ID, knobs, keep_frames=True)
    obs, _ = PushSimEnv().reset(seed=12)
    session = world.open_session(obs["frames"][0], PROMPT, DOMAIN_ID, knobs=knobs,
                                 generator=torch.Generator().manual_seed(12), action_width=2)
    committed, decoded = [session.first_latent], [obs["frames"][:1]]
    for w in range(2):
        result = world.step([session], [clips.actions[1, 4 * w:4 * (w + 1)]])[0]
        committed.append(result.latents)
        decoded.append(result.frames)
    world.close(session)
    assert torch.equal(own[1], torch.cat(committed, dim=1))
    assert frames.dtype == np.uint8 and frames.shape == (2, 9, 64, 64, 3)
    assert np.array_equal(frames[1], np.concatenate(decoded))  # the first frame, then what the model decoded
    assert model_loop(world, [12], 4, 4, PROMPT, DOMAIN_ID, knobs)[2] is None  # kept only when asked
    assert world.kv.num_used_pages == 0  # every session of the loop came back


@pytest.mark.parametrize("targets", ["replay", "reanchored"])
def test_a_fine_tune_in_stretches_equals_the_straight_one_bit_for_bit(base, tmp_path, monkeypatch, targets):
    from worldstep.train.self_forcing import OwnRollouts

    monkeypatch.setattr("worldstep.train.reanchor.detect_objects", _stub_detect)
    tune = [*TUNE, "--own-targets", targets]
    straight = main(["--out", str(tmp_path / "straight"), "--init-from", str(base), *tune])
    ticks = {"n": 0}

    def every_other_step(self) -> bool:
        ticks["n"] += 1
        return ticks["n"] % 2 == 0

    monkeypatch.setattr(Stretch, "expired", every_other_step)
    out, path, stretches = tmp_path / "stretches", None, 0
    args = ["--out", str(out), "--init-from", str(base), *tune, "--stop-after-minutes", "5"]
    while path is None:
        assert stretches < 10
        path = main(args + (["--resume"] if stretches else []))
        stretches += 1
    assert stretches >= 3
    a, b = _transformer(straight), _transformer(path)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    stored = OwnRollouts.load(out / "own_round1.pt")
    assert (stored.anchored is not None) == (targets == "reanchored")  # a resumed stretch trains on stored targets
    if targets == "reanchored":
        with pytest.raises(ValueError, match="--own-targets 'reanchored' -> 'replay'"):
            main(["--out", str(out), "--init-from", str(base), *TUNE, "--resume"])


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
    with pytest.raises(ValueError, match="own-targets='teacher' is invalid; allowed: 'replay' or 'reanchored'"):
        parse_args(["--own-targets", "teacher"])
    assert np.isfinite(parse_args(["--own-windows", "16"]).own_windows)


def test_resume_refuses_changed_own_targets():
    import dataclasses

    from worldstep.train.args import check_resume_args, parse_args

    saved = dataclasses.asdict(parse_args(["--own-targets", "replay"]))
    check_resume_args(parse_args(["--resume"]), saved)  # the same targets: no refusal
    with pytest.raises(ValueError, match="--own-targets 'replay' -> 'reanchored'"):
        check_resume_args(parse_args(["--resume", "--own-targets", "reanchored"]), saved)
    del saved["own_targets"]  # a run started before the flag computed its default, the replay's targets
    check_resume_args(parse_args(["--resume"]), saved)
    with pytest.raises(ValueError, match="--own-targets 'replay' -> 'reanchored'"):
        check_resume_args(parse_args(["--resume", "--own-targets", "reanchored"]), saved)


# Recorded with the code before --own-targets existed (commit 9f86fdf), on the `base` fixture: the replay's targets
# compute what they computed then.
REPLAY_LOSSES = [2.3115172386169434, 2.313638687133789, 2.359043598175049, 1.953531265258789, 1.9396617412567139,
                 2.2361795902252197]
REPLAY_HELD = [(2.1424081325531006, 2.1479101181030273), (2.1300790309906006, 2.1356191635131836)]


@pytest.mark.parametrize("flags", [[], ["--own-targets", "replay"]])
def test_replay_targets_train_as_before(base, tmp_path, flags):
    out = tmp_path / "ft"
    main(["--out", str(out), "--init-from", str(base), *TUNE, *flags])
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r.get("phase") == "self_forcing" and "loss" in r]
    held = [(r["heldout_own_context"], r["heldout_true_context"]) for r in records if "heldout_own_context" in r]
    assert losses == pytest.approx(REPLAY_LOSSES, rel=1e-5)
    assert held == [pytest.approx(h, rel=1e-5) for h in REPLAY_HELD]
    assert "anchored" not in torch.load(out / "own_round0.pt", weights_only=False)  # round files as before
    assert not any("reanchor_fallbacks" in r or "heldout_own_context_reanchored" in r for r in records)


# A clip whose frames push the block along y = 30 (integer centres and unit actions: detection is exact).
GOAL = np.array([50.0, 12.0])
ACTIONS = np.tile(np.array([[1.0, 0.0]], dtype=np.float32), (8, 1))  # two 4-action windows
TRUE_START = np.stack([np.array([20.0, 30.0]), np.array([44.0, 44.0]), GOAL])  # the block off the effector's path
SEEN_START = np.stack([np.array([20.0, 30.0]), np.array([32.0, 30.0]), GOAL])  # the block in its path: pushed


def _vae():
    from worldstep.train.pusher import architectures
    from worldstep.train.vae import make_vae

    return make_vae(architectures(True)[1], seed=5).eval()


def _reanchor(vae, model_frames: np.ndarray):
    """(re-anchored targets, anchors, replay latents) of len(model_frames) copies of the true clip."""
    from worldstep.train.data import ClipSet
    from worldstep.train.reanchor import reanchored_targets
    from worldstep.train.vae import encode_clips

    count = len(model_frames)
    clips = ClipSet(np.stack([TRUE_START] * count), np.stack([ACTIONS] * count))
    true = encode_clips(vae, clips)
    targets, anchors = reanchored_targets(vae, clips, model_frames, true, chunk=4)
    return targets, anchors, true


def test_reanchored_targets_follow_the_context():
    from worldstep.train.data import ClipSet, clip_cells, render_clip
    from worldstep.train.reanchor import anchored_cells
    from worldstep.train.vae import encode_clips

    torch.set_num_threads(1)
    vae = _vae()
    seen = render_clip(SEEN_START, ACTIONS)  # the "model's" frames: the simulator's, from another state
    targets, anchors, true = _reanchor(vae, seen[None])
    expected = encode_clips(vae, ClipSet(SEEN_START[None], ACTIONS[None]))  # what follows from the seen state
    # window 1 (latent 2) follows the state the model's frame 4 shows: the effector at x 32, the block pushed to 42
    assert np.array_equal(anchors[0, 1], np.stack([[32.0, 30.0], [42.0, 30.0], GOAL]))
    assert np.isnan(anchors[0, 0]).all()  # window 0 follows the true first frame: the replay's
    assert torch.equal(targets[:, :, :2], true[:, :, :2])
    assert torch.allclose(targets[:, :, 2], expected[:, :, 2], atol=1e-5)
    assert (targets[:, :, 2] - true[:, :, 2]).abs().max() > 1e-2  # not the replay's window
    cells = clip_cells(ClipSet(TRUE_START[None], ACTIONS[None]), 1, tuple(true.shape[-2:]))
    seen_cells = clip_cells(ClipSet(SEEN_START[None], ACTIONS[None]), 1, tuple(true.shape[-2:]))
    moved = anchored_cells(ClipSet(TRUE_START[None], ACTIONS[None]), anchors, cells, chunk=4)
    assert torch.equal(moved[:, :2], cells[:, :2]) and torch.equal(moved[:, 2], seen_cells[:, 2])  # the loss weighs
    assert not torch.equal(moved[:, 2], cells[:, 2])  # the objects where the re-anchored target shows them


def test_a_lost_block_keeps_the_replay_target():
    from worldstep.envs.push_sim import BACKGROUND
    from worldstep.train.data import render_clip
    from worldstep.train.reanchor import fallback_share

    torch.set_num_threads(1)
    seen = np.stack([render_clip(SEEN_START, ACTIONS)] * 2)
    anchor = seen[0, 4].astype(np.float32)
    blue = anchor[..., 2] - np.maximum(anchor[..., 0], anchor[..., 1]) > 60
    seen[0, 4][blue] = BACKGROUND.astype(np.uint8)  # clip 0 lost its block in the frame window 1 starts from
    targets, anchors, true = _reanchor(_vae(), seen)
    assert torch.equal(targets[0], true[0])  # the replay's window 1
    assert np.isnan(anchors[0]).all() and not np.isnan(anchors[1, 1]).any()
    assert (targets[1, :, 2] - true[1, :, 2]).abs().max() > 1e-2  # clip 1 is re-anchored in the same window
    assert fallback_share(anchors) == (1, 2)


def _stub_detect(frame):
    """Objects where the frame's pixel sum puts them (deterministic in the frame): the tiny model's frames show
    none, so without this every window would keep the replay's target. The block is lost in about a third."""
    total = int(np.asarray(frame, dtype=np.int64).sum())
    block = None if total % 3 == 0 else np.array([20.0 + total % 23, 40.0])
    return {"effector": np.array([10.0 + total % 7, 12.0]), "block": block, "goal": None}


def test_reanchored_batches_pair_own_context_with_reanchored_targets(base, tmp_path, monkeypatch):
    from worldstep.train.dynamics import DynamicsModel
    from worldstep.train.reanchor import fallback_share
    from worldstep.train.self_forcing import OwnRollouts

    monkeypatch.setattr("worldstep.train.reanchor.detect_objects", _stub_detect)
    seen, loss = [], DynamicsModel.loss

    def recording_loss(self, batch, context=None, context_level=None):
        if torch.is_grad_enabled():
            seen.append((batch.latents.clone(), None if context is None else context.clone()))
        return loss(self, batch, context, context_level)

    monkeypatch.setattr(DynamicsModel, "loss", recording_loss)
    out = tmp_path / "ft"
    main(["--out", str(out), "--init-from", str(base), *TUNE, "--own-targets", "reanchored"])
    rounds = [OwnRollouts.load(out / f"own_round{r}.pt") for r in (0, 1)]
    own, true, anchored = (torch.cat([getattr(d, k) for d in rounds]) for k in ("own", "true", "anchored"))
    windows = ~torch.from_numpy(np.isnan(np.concatenate([d.anchors for d in rounds])[:, :, 0, 0]))  # [N, W]
    assert windows[:, 0].sum() == 0 and windows.any() and not windows[:, 1:].all()
    assert not torch.equal(anchored, true)

    def row(stack: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return (stack == x).flatten(1).all(1)  # [N] which clips hold x

    kinds = set()
    for latents, context in seen:
        for b in range(len(latents)):
            if context is None:  # the replay's context: the replay's targets
                assert row(true, latents[b]).any()
                kinds.add("replay")
            else:  # own context: the re-anchored targets of the same clip
                assert (row(own, context[b]) & row(anchored, latents[b])).any()
                kinds.add("own")
    assert kinds == {"replay", "own"}
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    made = {r["name"]: r for r in records if r.get("phase") == "own_rollouts"}
    assert made["own_round0"]["reanchor_fallbacks"] == fallback_share(rounds[0].anchors)[0] > 0
    assert made["own_round0"]["reanchor_windows"] == 4 and made["own_held"]["own_targets"] == "reanchored"
    assert "heldout_own_context_reanchored" in records[-1]


@pytest.mark.parametrize("targets", ["replay", "reanchored"])
def test_a_fine_tune_with_context_noise_tells_the_model_its_level(base, tmp_path, monkeypatch, targets):
    from worldstep.train.dynamics import DynamicsModel

    monkeypatch.setattr("worldstep.train.reanchor.detect_objects", _stub_detect)

    seen = []
    loss = DynamicsModel.loss

    def recording_loss(self, batch, context=None, context_level=None):
        if torch.is_grad_enabled():  # a training step (the held-out loss runs without grad)
            seen.append(None if context_level is None else context_level.clone())
        return loss(self, batch, context, context_level)

    monkeypatch.setattr(DynamicsModel, "loss", recording_loss)
    tune = [a if a != "6" else "3" for a in TUNE]
    assert main(["--out", str(tmp_path / "ft"), "--init-from", str(base), *tune, "--context-level", "0.2",
                 "--own-targets", targets]).exists()
    assert len(seen) == 3 and all(s is not None and s.shape == (2,) and (s >= 0).all() and (s < 0.2).all()
                                  for s in seen)
