"""worldstep.train: the packed kv-shaped training pass and a smoke run whose checkpoint steps in the engine."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from worldstep.engine.models.cosmos3.layers import prefill_text
from worldstep.train.dynamics import ClipLayout, DynamicsBatch, DynamicsModel, text_kv
from worldstep.train.pusher import architectures, make_transformer


def _model(windows: int, context_tokens: int | None = None) -> DynamicsModel:
    arch, _ = architectures(small=True)
    arch = dict(arch, num_hidden_layers=2)
    tr = make_transformer(arch, seed=0)
    with torch.no_grad():  # diffusers zero-inits proj_out; random weights make the checks meaningful
        for p in tr.parameters():
            p.add_(0.05 * torch.randn_like(p))
    layout = ClipLayout(windows, 1, 4, 16, context_tokens)
    return DynamicsModel(tr, layout, torch.arange(5, 17), 1, (4, 4), 24.0)


def _batch(bsz: int, windows: int, seed: int = 0) -> DynamicsBatch:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(bsz, 4, 1 + windows, 4, 4, generator=g)
    actions = torch.rand(bsz, 4 * windows, 8, generator=g) * 2 - 1
    return DynamicsBatch(z, actions, torch.rand(bsz, windows, generator=g), torch.randn(z.shape, generator=g))


def _slice(batch: DynamicsBatch, i: int) -> DynamicsBatch:
    return DynamicsBatch(*(t[i: i + 1] for t in (batch.latents, batch.actions, batch.sigmas, batch.noise)))


@torch.no_grad()
def test_packed_clips_equal_clip_by_clip():
    model, batch = _model(3, context_tokens=20), _batch(3, 3)
    packed, _ = model.velocity(batch)
    for i in range(3):
        alone, _ = model.velocity(_slice(batch, i))
        torch.testing.assert_close(packed[i: i + 1], alone, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_windows_are_causal_like_the_kv_rollout():
    model, batch = _model(4), _batch(1, 4)
    pred, _ = model.velocity(batch)
    later = DynamicsBatch(batch.latents.clone(), batch.actions.clone(), batch.sigmas, batch.noise.clone())
    later.latents[:, :, 3:] += 1.0  # windows 2, 3 change (latent frames 3, 4)
    later.actions[:, 8:] = -later.actions[:, 8:]
    later.noise[:, :, 3:] += 1.0
    pred2, _ = model.velocity(later)
    torch.testing.assert_close(pred[:, :, :2], pred2[:, :, :2])  # windows 0, 1 cannot see the future
    assert (pred[:, :, 2:] - pred2[:, :, 2:]).abs().max() > 1e-3
    # a window's own noise does not leak into the other windows' predictions
    noisy = DynamicsBatch(batch.latents, batch.actions, batch.sigmas, batch.noise.clone())
    noisy.noise[:, :, 2] += 1.0  # window 1's noise
    pred3, _ = model.velocity(noisy)
    torch.testing.assert_close(pred[:, :, [0, 2, 3]], pred3[:, :, [0, 2, 3]])


def test_mask_follows_retention_horizon():
    layout = ClipLayout(4, 1, 4, 16, context_tokens=20)  # one window of committed context
    mask = layout.gen_mask()
    sizes = [36, 20, 20]  # clean windows 0..2 (committed order)
    clean_total = sum(sizes)
    noisy3 = clean_total + 36 + 20 + 20  # first token of noisy window 3
    assert mask[noisy3, 56:76].all() and not mask[noisy3, :56].any()  # sees clean window 2 only
    assert mask[noisy3, noisy3:noisy3 + 20].all() and not mask[noisy3, clean_total:noisy3].any()
    assert mask[0, :36].all() and not mask[0, 36:].any()  # clean window 0 sees itself only


def test_text_kv_is_differentiable_and_equals_engine_prefill():
    model = _model(1)
    ids = torch.arange(3, 40)
    keys, values = text_kv(model.transformer, ids)
    assert keys.requires_grad  # training backpropagates into the understanding pathway
    ref_k, ref_v = prefill_text(model.transformer, ids)
    torch.testing.assert_close(keys.detach(), ref_k)
    torch.testing.assert_close(values.detach(), ref_v)


def test_smoke_run_loss_falls_and_checkpoint_steps(tmp_path):
    from worldstep.engine.config import RolloutKnobs
    from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel
    from worldstep.envs.push_sim import PushSimEnv
    from worldstep.train import main
    from worldstep.train.pusher import DOMAIN_ID, PROMPT

    out = tmp_path / "run"
    path = main(["--out", str(out), "--small", "--num-clips", "12", "--windows", "2", "--context-frames", "1",
                 "--vae-steps", "5", "--vae-batch", "1", "--dyn-steps", "40", "--dyn-batch", "4", "--dagger-clips", "2",
                 "--dyn-lr",
                 "3e-3", "--log-every", "1", "--ckpt-every", "1000", "--threads", "1"])
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    # the VAE's last 40% of steps trains on whole clips (9 frames here), the rest on short crops
    assert [r["frames"] for r in records if r.get("phase") == "vae" and "loss" in r] == [5, 5, 5, 9, 9]
    done = next(r for r in records if r.get("event") == "done" and r.get("phase") == "vae")
    assert np.isfinite(done["heldout_last_latent_psnr_db"])
    losses = [r["loss"] for r in records if r.get("phase") == "dynamics" and "loss" in r]
    assert len(losses) >= 30
    assert np.mean(losses[-8:]) < 0.8 * np.mean(losses[:5])

    meta = json.loads((path / "worldstep.json").read_text())
    assert meta["config"] == "pusher"  # run settings of the folder
    assert meta["trained_horizon_windows"] == 2  # --windows: what the training clips cover (the trust horizon)
    world = Cosmos3WorldModel.from_pretrained(path, device="cpu", page_size=4, num_pages=256)
    assert (world.spec.height, world.spec.width) == (64, 64)
    obs, _ = PushSimEnv().reset(seed=0)
    session = world.open_session(obs["frames"][0], PROMPT, DOMAIN_ID, knobs=RolloutKnobs(context_frames=1),
                                 generator=torch.Generator().manual_seed(0), action_width=2)
    for _ in range(2):
        result = world.step([session], [np.zeros((4, 2), np.float32)])[0]
        assert result.frames.shape == (4, 64, 64, 3) and result.frames.dtype == np.uint8

    # a snapshot export of the same run carries the same weights
    snap = main(["--out", str(out), "--small", "--export-only", str(tmp_path / "snap")])
    again = Cosmos3WorldModel.from_pretrained(snap, device="cpu", page_size=4, num_pages=64)
    assert json.loads((snap / "worldstep.json").read_text())["trained_horizon_windows"] == 2
    for a, b in zip(world.transformer.parameters(), again.transformer.parameters()):
        torch.testing.assert_close(a, b)


def test_pusher_config_matches_training_architecture():
    from pathlib import Path

    import yaml
    from worldstep.train.pusher import TRANSFORMER_ARCH
    from worldstep.train.vae import VAE_ARCH

    config = yaml.safe_load((Path(__file__).parents[1] / "configs" / "pusher.yaml").read_text())
    arch = config["model"]["architecture"]
    assert arch["transformer"] == {k: v for k, v in TRANSFORMER_ARCH.items() if k != "dtype"}
    assert arch["vae"] == VAE_ARCH
    assert config["rollout"]["chunk_size"] == 4 and config["rollout"]["context_frames"] == 4


def test_shipped_pusher_checkpoint_follows_actions():
    """The embedded `pusher` weights load from package data and move the effector the way actions say."""
    from pathlib import Path

    from worldstep.engine.config import RolloutKnobs
    from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel
    from worldstep.envs.push_sim import PushSimEnv, detect_objects

    path = Path(__file__).parents[1] / "configs" / "models" / "pusher"
    world = Cosmos3WorldModel.from_pretrained(path, device="cpu", page_size=4, num_pages=512)
    meta = json.loads((path / "worldstep.json").read_text())
    obs, info = PushSimEnv().reset(seed=3)
    moved = []
    for direction in (1.0, -1.0):
        session = world.open_session(obs["frames"][0], meta["prompt"], meta["domain_id"],
                                     knobs=RolloutKnobs(context_frames=4), generator=torch.Generator().manual_seed(0),
                                     action_width=2)
        actions = np.zeros((4, 2), np.float32)
        actions[:, 0] = direction
        frames = world.step([session], [actions])[0].frames
        moved.append(detect_objects(frames[-1])["effector"][0] - info["effector"][0])
        world.close(session)
    assert moved[0] > 4 and moved[1] < -4  # 4 steps of 3 px: about +-12 px in the simulator


@pytest.mark.parametrize("level", [0.0, 0.3])
def test_training_forward_equals_the_rollout_forward(tmp_path, monkeypatch, level):
    """The training pass predicts, for every window of a clip, exactly the velocity the engine's paged
    rollout computes at that window's denoise step (same clip: the rollout's own committed latents).

    The rollout's committed context, noisy window tensors, timesteps and velocities are recorded at its
    scheduler step; the training batch is built from them (noise chosen so that `(1 - s) z + s eps` is the
    rollout's noisy tensor at `s = t / 1000`); one session steps alone, so it is row 0 of the window's
    stacked scheduler call. `page_size=1` makes the engine's page-floored retention
    equal the nominal horizon the training mask uses (`context_frames` latent frames). With context noise at
    `level`, the windows the engine committed (noised, the level as their timestep) are the training's context.
    """
    from worldstep.engine.config import RolloutKnobs
    from worldstep.engine.models.cosmos3 import window as window_module
    from worldstep.engine.models.cosmos3.checkpoint import build_checkpoint
    from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel
    from worldstep.engine.models.cosmos3.prompt import tokenize_action_prompt
    from worldstep.engine.models.cosmos3.unipc import UniPCStepper
    from worldstep.envs.push_sim import PushSimEnv

    t_arch, v_arch = architectures(small=True)
    t_arch = {k: v for k, v in t_arch.items() if k != "dtype"}
    path = build_checkpoint(tmp_path / "ckpt", {"transformer": t_arch, "vae": v_arch, "height": 64, "width": 64,
                                                "fps": 24}, seed=1)
    world = Cosmos3WorldModel.from_pretrained(path, device="cpu", page_size=1, num_pages=4096)
    windows, context_frames, prompt, domain = 3, 1, "push the block", 2
    knobs = RolloutKnobs(chunk_size=4, num_steps=3, context_frames=context_frames, context_noise=level)
    noised, noise_it = [], window_module._noised

    def recording_noise(job, at):
        noised.append(noise_it(job, at))
        return noised[-1]

    monkeypatch.setattr(window_module, "_noised", recording_noise)
    obs, _ = PushSimEnv().reset(seed=11)
    session = world.open_session(obs["frames"][0], prompt, domain, knobs=knobs,
                                 generator=torch.Generator().manual_seed(5), action_width=2)
    calls = []  # (timestep, noisy window tensor, velocity) per denoise step, in order
    step = UniPCStepper.step  # the engine's stepper (diffusers' UniPC coefficients, computed before the loop)

    def recording_step(self, velocity, sample):
        calls.append((float(self.plan.timesteps[self.index]), sample[0].clone(), velocity[0].clone()))
        return step(self, velocity, sample)

    monkeypatch.setattr(UniPCStepper, "step", recording_step)
    actions = np.random.default_rng(0).uniform(-1, 1, (windows, 4, 2)).astype(np.float32)
    committed = [session.first_latent]
    for w in range(windows):
        committed.append(world.step([session], [actions[w]])[0].latents)  # [C, 1, h, w]
    world.close(session)
    assert len(calls) == windows * knobs.num_steps
    z = torch.cat(committed, dim=1)[None]  # [1, C, 1 + W, h, w]
    assert len(noised) == (windows if level else 0)
    context = torch.cat(noised, dim=1)[None] if level else None  # [1, C, 1 + W, h, w]: what each commit saw
    context_level = torch.tensor([level]) if level else None

    tr = world.transformer
    per_frame = world.spec.tokens_per_frame
    layout = ClipLayout(windows, 1, 4, per_frame, context_frames * (per_frame + 4))
    ids = tokenize_action_prompt(world.components.tokenizer, prompt, "", view_point="ego_view", num_frames=5,
                                 fps=world.spec.fps, height=64, width=64,
                                 use_system_prompt=world.components.default_use_system_prompt).cond
    model = DynamicsModel(tr, layout, torch.tensor(ids), domain, (world.spec.latent_height, world.spec.latent_width),
                          float(world.spec.fps))
    padded = torch.zeros(1, 4 * windows, tr.config.action_dim)
    padded[0, :, :2] = torch.from_numpy(actions.reshape(-1, 2))
    for index in range(knobs.num_steps):  # every denoise step: all windows at once in the training pass
        picked = [calls[w * knobs.num_steps + index] for w in range(windows)]
        sigmas = torch.tensor([[t / 1000.0 for t, _, _ in picked]])  # [1, W]
        noise = torch.zeros_like(z)
        for w, (_, sample, _) in enumerate(picked):
            s = sigmas[0, w]
            start, end = layout.frames(w)
            lead = 1 if w == 0 else 0
            noise[0, :, start + lead:end] = (sample[:, lead:] - (1 - s) * z[0, :, start + lead:end]) / s
        with torch.no_grad():
            pred, _ = model.velocity(DynamicsBatch(z, padded, sigmas, noise), context, context_level)  # [1,C,W,h,w]
        for w, (_, _, velocity) in enumerate(picked):
            lead = 1 if w == 0 else 0
            torch.testing.assert_close(pred[0, :, w:w + 1], velocity[:, lead:], atol=2e-5, rtol=1e-4)
    assert world.live_sessions == 0


def test_a_fine_tune_records_the_longer_of_its_own_rollouts_and_its_init_s_horizon(tmp_path):
    from types import SimpleNamespace

    from worldstep.train.self_forcing import trained_horizon

    (tmp_path / "worldstep.json").write_text(json.dumps({"trained_horizon_windows": 8}))
    run = tmp_path / "run"
    assert trained_horizon(SimpleNamespace(own_windows=16, init_from=str(tmp_path), out=str(run))) == 16
    assert trained_horizon(SimpleNamespace(own_windows=4, init_from=str(tmp_path), out=str(run))) == 8
    assert trained_horizon(SimpleNamespace(own_windows=4, init_from=str(tmp_path / "none"), out=str(run))) == 4
    run.mkdir()
    (run / "args.json").write_text(json.dumps({"own_windows": 12}))  # an export of a run: the run's own flag
    assert trained_horizon(SimpleNamespace(own_windows=4, init_from=str(tmp_path), out=str(run))) == 12
