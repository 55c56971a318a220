"""The training pipeline behind `python -m worldstep.train` (its flags: `args.py`): data, the VAE, latents, forward
dynamics and the export, each phase resumable; `--init-from` runs the self-forcing phase instead (`self_forcing`)."""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from worldstep.envs.push_seeds import DAGGER
from worldstep.measures.frames import psnr

from .args import TrainArgs, check_resume_args, parse_args, run_value
from .dagger import model_loop_clips
from .data import (
    CLIP_KINDS,
    ClipSet,
    clip_cells,
    concat_clips,
    render_clip,
    take_clips,
    to_video_tensor,
    training_clips,
)
from .dynamics import ClipLayout, DynamicsBatch, DynamicsModel, dyn_batch
from .pusher import DOMAIN_ID, FPS, PROMPT, architectures, export_checkpoint, make_transformer, text_ids
from .self_forcing import export_snapshot as export_fine_tune
from .self_forcing import fine_tune
from .stretches import PhaseBudget, RunLog, Stretch, StretchEnded, cosine_lr, save_state
from .vae import encode_clips, latent_stats, make_vae, sample_vae_batch, vae_loss

# --- VAE ---------------------------------------------------------------------------------------


def train_vae(args: TrainArgs, clips, held, vae_arch, log: RunLog, out: Path, budget_s: float,
              stretch: Stretch | None = None):
    from worldstep.engine.vae.frames import frames_from_pixels

    state_path = out / "vae_state.pt"
    vae = make_vae(vae_arch, args.seed)
    if args.vae_init:  # warm start from another run's VAE (weights only)
        vae.load_state_dict(torch.load(args.vae_init, weights_only=False)["model"])
    opt = torch.optim.AdamW(vae.parameters(), lr=args.vae_lr, weight_decay=0.0)
    rng = np.random.default_rng(args.seed + 1)
    noise_gen = torch.Generator().manual_seed(args.seed + 5)
    prog = PhaseBudget(budget_s, args.vae_steps)
    if args.resume and state_path.exists():
        st = torch.load(state_path, weights_only=False)
        vae.load_state_dict(st["model"])
        if st.get("done"):  # a finished VAE keeps its weights only (the optimiser is not needed again)
            vae.register_to_config(latents_mean=st["config"]["latents_mean"], latents_std=st["config"]["latents_std"])
            return vae.eval()
        opt.load_state_dict(st["opt"])
        rng.bit_generator.state = st["rng"]
        if "noise_gen" in st:
            noise_gen.set_state(st["noise_gen"])
        prog = PhaseBudget(st.get("budget_s", budget_s), args.vae_steps, st["step"], st["elapsed"])
    short = 5 if args.small else 9
    long_frames = min(9 if args.small else args.vae_long_frames, 1 + args.windows * args.chunk)  # <= a clip
    long_batch = max(1, args.vae_batch * short // long_frames)  # about the same frames per step
    vae.train()
    bar = tqdm(desc="vae", initial=prog.step, mininterval=5)
    while prog.fraction < 1.0:
        for group in opt.param_groups:
            group["lr"] = cosine_lr(args.vae_lr, prog.fraction, prog.step, warmup=10)
        # short crops teach the spatial code fast; the last share runs whole long crops, so encoder and
        # decoder stay stable when their causal caches run over many latents (trained on 9-frame crops
        # only, a decoder degrades from the 4th latent on: 26 dB -> 17 dB)
        long = prog.fraction >= 1.0 - args.vae_long_share
        frames, batch = (long_frames, long_batch) if long else (short, args.vae_batch)
        loss_t, _ = vae_loss(vae, sample_vae_batch(clips, rng, batch, frames), args.vae_latent_noise, noise_gen)
        opt.zero_grad(set_to_none=True)
        loss_t.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        loss = loss_t.item()
        if prog.step % args.log_every == 0:
            log.write(phase="vae", step=prog.step, loss=loss, lr=opt.param_groups[0]["lr"], frames=frames,
                      time=time.time())
            bar.set_postfix(loss=f"{loss:.4f}", progress=f"{prog.fraction:.2f}")
        prog.advance()
        bar.update()
        stop = stretch is not None and stretch.expired() and prog.fraction < 1.0
        if prog.step % args.ckpt_every == 0 or stop:
            save_state(state_path, {"model": vae.state_dict(), "opt": opt.state_dict(), "rng": rng.bit_generator.state,
                               "noise_gen": noise_gen.get_state(), **prog.state(), "budget_s": prog.budget_s})
        if stop:
            log.write(phase="vae", event="stretch_end", step=prog.step, time=time.time())
            raise StretchEnded(f"vae step {prog.step}")
    vae.eval()
    mean, std = latent_stats(vae, clips, count=32)
    vae.register_to_config(latents_mean=mean, latents_std=std)
    with torch.no_grad():  # whole held-out clips: what a rollout of `windows` windows decodes
        truth = np.stack([render_clip(held.starts[i], held.actions[i]) for i in range(min(8, len(held)))])
        recon = vae.decode(vae.encode(to_video_tensor(truth)).latent_dist.mean).sample
    # the report's PSNR: per uint8 frame as the engine's decoder maps pixels (frames_from_pixels), then the mean
    frame_psnr = psnr(np.stack([frames_from_pixels(clip) for clip in recon]), truth)  # [clips, frames]
    held_psnr, last_psnr = float(frame_psnr.mean()), float(frame_psnr[:, -4:].mean())
    log.write(phase="vae", event="done", heldout_psnr_db=held_psnr, heldout_last_latent_psnr_db=last_psnr,
              latents_mean=mean, latents_std=std)
    save_state(state_path, {"model": vae.state_dict(), **prog.state(), "done": True, "config": dict(vae.config)})
    return vae


# --- dynamics ----------------------------------------------------------------------------------


def train_dynamics(args: TrainArgs, latents: torch.Tensor, actions: np.ndarray, held_latents: torch.Tensor,
                   held_actions: np.ndarray, t_arch, tokenizer, log: RunLog, out: Path, budget_s: float,
                   cells: torch.Tensor | None = None, stretch: Stretch | None = None):
    state_path = out / "dyn_state.pt"
    tr = make_transformer(t_arch, args.seed + 2)
    ema = copy.deepcopy(tr).requires_grad_(False)
    per_frame = latents.shape[-1] * latents.shape[-2] // t_arch["latent_patch_size"] ** 2
    horizon = args.context_frames * (per_frame + 4) if args.context_frames > 0 else None
    lay = ClipLayout(args.windows, args.chunk // 4, args.chunk, per_frame, horizon)
    model = DynamicsModel(tr, lay, text_ids(tokenizer, args.chunk), DOMAIN_ID, tuple(latents.shape[-2:]), FPS)
    opt = torch.optim.AdamW(tr.parameters(), lr=args.dyn_lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed + 3)
    rng = np.random.default_rng(args.seed + 4)
    prog = PhaseBudget(budget_s, args.dyn_steps)
    if args.resume and state_path.exists():
        st = torch.load(state_path, weights_only=False)
        tr.load_state_dict(st["model"])
        ema.load_state_dict(st["ema"])
        opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"])
        rng.bit_generator.state = st["rng"]
        prog = PhaseBudget(st.get("budget_s", budget_s), args.dyn_steps, st["step"], st["elapsed"])
        if st.get("done"):
            return ema
    action_dim = t_arch["action_dim"]

    def one(i: int) -> float:
        for group in opt.param_groups:
            group["lr"] = cosine_lr(args.dyn_lr, prog.fraction, i, warmup=20)
        batch = dyn_batch(latents, actions, rng.integers(len(latents), size=args.dyn_batch), action_dim, gen,
                          args.windows, cells, args.moving_weight)
        ctx = batch.latents
        # commit the model's own estimates, as a rollout does (ramped in: an untrained model's are noise)
        if rng.random() < args.own_context_share * min(1.0, prog.fraction / 0.3):
            sigmas = 0.1 + 0.4 * torch.rand(batch.sigmas.shape, generator=gen)
            ctx = model.denoised(DynamicsBatch(batch.latents, batch.actions, sigmas,
                                               torch.randn(batch.latents.shape, generator=gen)))
        if args.context_noise > 0:
            level = torch.rand(batch.latents.shape[0], 1, 1, 1, 1, generator=gen) * args.context_noise
            ctx = ctx + level * torch.randn(batch.latents.shape, generator=gen)
        loss = model.loss(batch, ctx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tr.parameters(), 1.0)
        opt.step()
        decay = min(args.ema, (1 + i) / (10 + i))
        with torch.no_grad():
            for pe, p in zip(ema.parameters(), tr.parameters()):
                pe.lerp_(p, 1 - decay)
        return loss.item()

    def held_loss() -> float:
        ema_model = DynamicsModel(ema, lay, model.text_ids, DOMAIN_ID, model.latent_hw, FPS)
        g = torch.Generator().manual_seed(1234)
        n = min(len(held_latents), 16)
        with torch.no_grad():
            b = dyn_batch(held_latents, held_actions, np.arange(n), action_dim, g, args.windows)
            return ema_model.loss(b).item()

    def snapshot(done: bool = False) -> None:
        save_state(state_path, {"model": tr.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(),
                           "gen": gen.get_state(), "rng": rng.bit_generator.state, **prog.state(), "done": done,
                           "budget_s": prog.budget_s})

    tr.train()
    bar = tqdm(desc="dynamics", initial=prog.step, mininterval=5)
    while prog.fraction < 1.0:
        loss = one(prog.step)
        if prog.step % args.log_every == 0:
            log.write(phase="dynamics", step=prog.step, loss=loss, lr=opt.param_groups[0]["lr"], time=time.time())
            bar.set_postfix(loss=f"{loss:.4f}", progress=f"{prog.fraction:.2f}")
        prog.advance()
        bar.update()
        stop = stretch is not None and stretch.expired() and prog.fraction < 1.0
        if prog.step % args.ckpt_every == 0 or stop:
            snapshot()
        if prog.step % (5 * args.ckpt_every) == 0:
            log.write(phase="dynamics", step=prog.step, heldout_loss=held_loss(), time=time.time())
        if stop:
            log.write(phase="dynamics", event="stretch_end", step=prog.step, time=time.time())
            raise StretchEnded(f"dynamics step {prog.step}")
    log.write(phase="dynamics", event="done", heldout_loss=held_loss())
    snapshot(done=True)
    return ema


# --- export ------------------------------------------------------------------------------------


# --- main --------------------------------------------------------------------------------------


def export_snapshot(args: TrainArgs, target: Path) -> Path:
    """Export the finished VAE and the latest dynamics EMA weights of a run (in progress or not)."""
    from worldstep.engine.models.cosmos3.checkpoint import build_tokenizer

    out = Path(args.out)
    t_arch, v_arch = architectures(args.small)
    vae_state = torch.load(out / "vae_state.pt", weights_only=False)
    if not vae_state.get("done"):
        raise ValueError(f"{out / 'vae_state.pt'} is not a finished VAE; allowed: a run past its VAE phase")
    vae = make_vae(v_arch, args.seed)
    vae.load_state_dict(vae_state["model"])
    vae.register_to_config(latents_mean=vae_state["config"]["latents_mean"],
                           latents_std=vae_state["config"]["latents_std"])
    transformer = make_transformer(t_arch, args.seed + 2)
    transformer.load_state_dict(torch.load(out / "dyn_state.pt", weights_only=False)["ema"])
    tokenizer = build_tokenizer(int(t_arch["vocab_size"]))
    return export_checkpoint(target, transformer.eval(), vae.eval(), tokenizer,
                             trained_horizon=run_value(args, "windows"))


def _head(clips: ClipSet, count: int) -> ClipSet:
    return ClipSet(clips.starts[:count], clips.actions[:count])


def dagger_round(args: TrainArgs, steps: int, out: Path, log: RunLog) -> ClipSet:
    """The DAgger round's clips (cached in the run folder, so a resumed run reuses them)."""
    from worldstep.engine.config import RolloutKnobs
    from worldstep.world import load

    path = out / "dagger_clips.npz"
    if path.exists():
        cached = np.load(path)
        return ClipSet(cached["starts"], cached["actions"], cached["seeds"])
    t0 = time.perf_counter()
    world = load(args.dagger_checkpoint, device="cpu")
    rollout = world.config.rollout
    knobs = RolloutKnobs(num_steps=rollout.num_steps, context_frames=rollout.context_frames,
                         flow_shift=rollout.flow_shift)
    try:
        clips = model_loop_clips(world.model, DAGGER.seeds(args.dagger_clips), steps, args.chunk, PROMPT,
                                 DOMAIN_ID, knobs)
    finally:
        world.model.close_all()
    np.savez(path, starts=clips.starts, actions=clips.actions, seeds=clips.seeds)
    log.write(phase="dagger", clips=len(clips), checkpoint=args.dagger_checkpoint,
              seconds=time.perf_counter() - t0)
    return clips


def run_data(args: TrainArgs, out: Path, log: RunLog) -> tuple[ClipSet, ClipSet]:
    """(training clips, held-out clips): the mixture of `training_clips` plus the DAgger round, shuffled by the
    seed so that every kind is in the head that `--encode-clips` encodes."""
    steps = args.windows * args.chunk
    t0 = time.perf_counter()
    mixed, kinds = training_clips(args.num_clips - args.dagger_clips, steps, seed=args.seed, chunk=args.chunk)
    parts = [mixed]
    if args.dagger_clips:
        parts.append(dagger_round(args, steps, out, log))
        kinds = np.concatenate([kinds, np.full(args.dagger_clips, CLIP_KINDS.index("model_loop"))])
    order = np.random.default_rng(args.seed + 20).permutation(args.num_clips)
    clips, kinds = take_clips(concat_clips(*parts), order), kinds[order]
    held, _ = training_clips(max(8, args.num_clips // 20), steps, seed=args.seed + 10_000, chunk=args.chunk)
    counts = {name: int((kinds == i).sum()) for i, name in enumerate(CLIP_KINDS)}
    log.write(phase="data", clips=len(clips), held=len(held), kinds=counts, seconds=time.perf_counter() - t0)
    return clips, held


def start_log(args: TrainArgs, out: Path) -> RunLog:
    """The run's log; a resumed run must have the arguments the run started with (`check_resume_args`)."""
    saved_path = out / "args.json"
    if args.resume and saved_path.exists():
        check_resume_args(args, json.loads(saved_path.read_text()))
    elif args.resume and any(out.glob("*_state.pt")):
        raise ValueError(f"--resume: {saved_path} is missing, so the run's arguments cannot be checked")
    else:
        saved_path.write_text(json.dumps(asdict(args), indent=1))
    log = RunLog(out / "log.jsonl")
    log.write(event="resume" if args.resume else "start", args=asdict(args), time=time.time())
    return log


def main(argv: list[str] | None = None) -> Path | None:
    """Run (or resume) the whole pipeline; returns the exported checkpoint folder, or None when the stretch's
    wall time (`--stop-after-minutes`) ended it first (continue with `--resume`)."""
    from worldstep.engine.models.cosmos3.checkpoint import build_tokenizer

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.export_only and args.init_from is not None:
        return export_fine_tune(args, Path(args.export_only), build_tokenizer)
    if args.export_only:
        return export_snapshot(args, Path(args.export_only))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = start_log(args, out)
    stretch = Stretch(args.stop_after_minutes)
    try:
        if args.init_from is not None:
            return fine_tune(args, out, log, stretch, build_tokenizer)
        return _run(args, out, log, stretch, build_tokenizer)
    except StretchEnded as ended:
        log.write(event="stretch_end", at=str(ended), time=time.time())
        print(f"stopped at {ended}: the stretch's {args.stop_after_minutes:g} minutes are spent; continue with "
              f"--resume --out {out}")
        return None


def _run(args: TrainArgs, out: Path, log: RunLog, stretch: Stretch, build_tokenizer) -> Path:
    t_arch, v_arch = architectures(args.small)
    budget = args.budget_minutes * 60
    start = time.perf_counter()
    clips, held = run_data(args, out, log)

    # vae
    vae = train_vae(args, clips, held, v_arch, log, out, budget * args.vae_share, stretch)

    # latents
    latents_path = out / "latents.pt"
    if args.resume and latents_path.exists():
        cached = torch.load(latents_path)
        latents, held_latents = cached["train"], cached["held"]
    else:
        t0 = time.perf_counter()
        # encoding costs about a sixth of a VAE training step per frame: encode only the clips the
        # dynamics phase can use in its budget (the VAE itself trained on all of them)
        latents = encode_clips(vae, _head(clips, args.encode_clips))
        held_latents = encode_clips(vae, _head(held, 32))
        save_state(latents_path, {"train": latents, "held": held_latents})
        log.write(phase="latents", shape=list(latents.shape), seconds=time.perf_counter() - t0)

    # dynamics
    tokenizer = build_tokenizer(int(t_arch["vocab_size"]))
    # a resumed phase keeps the budget it started with; a phase starting now gets what is left
    remaining = budget - (time.perf_counter() - start) - 90  # keep time for the held-out pass and export
    cells = clip_cells(clips, len(latents), tuple(latents.shape[-2:]))  # where the loss weighs more
    transformer = train_dynamics(args, latents, clips.actions[: len(latents)], held_latents,
                                 held.actions[: len(held_latents)], t_arch, tokenizer, log,
                                 out, max(remaining, 1.0), cells, stretch)

    # export
    path = export_checkpoint(out / "checkpoint", transformer, vae, tokenizer, trained_horizon=args.windows)
    log.write(event="exported", path=str(path), seconds=time.perf_counter() - start)
    return path
