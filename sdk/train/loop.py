"""`python -m worldstep.train`: simulator clips -> VAE -> latents -> forward dynamics -> diffusers checkpoint.

Every phase checkpoints into `--out` and `--resume` continues where a run stopped. The default run is a
fixed number of steps per phase (`--vae-steps`, `--dyn-steps`), so its result does not depend on how
busy the machine is; with a phase's steps set to 0 it runs for its share of `--budget-minutes` instead.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm
from worldstep.envs.push_sim import PUSHER_EMBODIMENT

from ..flags import flag, parse_flags
from .dagger import model_loop_clips
from .data import (
    CLIP_KINDS,
    ClipSet,
    concat_clips,
    moving_cells,
    render_clip,
    take_clips,
    to_video_tensor,
    training_clips,
)
from .dynamics import ClipLayout, DynamicsBatch, DynamicsModel, sample_sigmas
from .vae import VAE_ARCH, encode_clips, latent_stats, make_vae, sample_vae_batch, vae_loss

TRANSFORMER_ARCH: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "head_dim": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "latent_channel": 16,
    "latent_patch_size": 1,
    "patch_latent_dim": 16,
    "vocab_size": 256,
    "rope_axes_dim": [8, 4, 4],
    "hidden_act": "relu2",
    "qk_norm_for_text": False,
    "use_und_k_norm_for_gen": True,
    "action_gen": True,
    "action_dim": 8,
    "num_embodiment_domains": 4,
    "base_fps": 24,
    "dtype": "float32",
}
PROMPT = "A robot pushes a block to the goal."
DOMAIN_ID = PUSHER_EMBODIMENT["domain_id"]
FPS = PUSHER_EMBODIMENT["fps"]
SIZE = 64
# The embodiment a trained folder registers in its worldstep.json; its domains are its own, so the Cosmos3
# built-in names do not apply to it.
EMBODIMENT = PUSHER_EMBODIMENT


@dataclass
class TrainArgs:
    """The run's arguments: one flag each (``worldstep.flags``); ``args.json`` in the run folder holds them."""

    out: str = "runs/pusher"
    """run folder (logs, phase checkpoints, checkpoint/)"""
    budget_minutes: float = 80.0
    """total wall budget of the phases whose steps are 0 (see --vae-steps, --dyn-steps)"""
    seed: int = 0
    """seeds data, init and noise"""
    resume: bool = False
    """continue from the phase checkpoints in --out; a phase already under way keeps its budget, phases not yet
    started share --budget-minutes counted from now"""
    num_clips: int = 4000
    """simulator clips"""
    windows: int = 8
    """windows per training clip"""
    chunk: int = 4
    """actions per window (4 or 8)"""
    context_frames: int = 4
    """latent frames of committed context a window sees (the rollout's context_frames; 0 = all)"""
    vae_share: float = 0.45
    """budget share of the VAE"""
    vae_batch: int = 8
    """9-frame crops per VAE step"""
    vae_long_share: float = 0.4
    """last share of the VAE phase trained on long crops (the causal caches must stay stable over a whole
    rollout, not only the 3 latents of a short crop)"""
    vae_long_frames: int = 33
    """frames of a long crop (1 + 4k; capped at a clip's 1 + windows * chunk)"""
    vae_lr: float = 2e-3
    """VAE learning rate"""
    dyn_batch: int = 16
    """clips per dynamics step"""
    dyn_lr: float = 2e-3
    """dynamics learning rate"""
    ema: float = 0.98
    """EMA decay cap of the exported dynamics weights (a CPU budget gives few steps)"""
    context_noise: float = 0.03
    """max std of noise on clean context latents (robustness to own errors)"""
    own_context_share: float = 0.5
    """share of dynamics steps whose committed windows are the model's own one-step estimates (what a rollout
    commits) instead of the true latents"""
    moving_weight: float = 2.0
    """extra flow-matching loss weight on latent cells the effector or block covers"""
    vae_latent_noise: float = 0.1
    """max noise on the VAE's latents before decoding, relative to each channel's spread"""
    ckpt_every: int = 20
    """steps between checkpoints"""
    encode_clips: int = 4000
    """training clips encoded to latents for the dynamics phase"""
    log_every: int = 10
    """steps between log lines"""
    vae_steps: int = 1600
    """VAE steps (0: its share --vae-share of --budget-minutes)"""
    dyn_steps: int = 10000
    """dynamics steps (0: what is left of --budget-minutes)"""
    threads: int = 1
    """torch threads (1: on a shared 2-core box two threads ran 5x slower per step)"""
    dagger_clips: int = 600
    """clips of the DAgger round: graded policies acting closed loop on --dagger-checkpoint, their actions
    replayed in the simulator (0: none)"""
    dagger_checkpoint: str = "pusher"
    """the world model whose loop the DAgger round follows (a config name or a checkpoint folder)"""
    stop_after_minutes: float = 0.0
    """wall time of this stretch: checkpoint and exit cleanly when it is spent; continue with --resume (0: run to
    the end)"""
    small: bool = False
    """tiny models and data (smoke tests)"""
    vae_init: str | None = flag("start the VAE from the weights in another run's vae_state.pt", default=None,
                                metavar="VAE_STATE")
    init_from: str | None = flag("fine-tune from this checkpoint folder on the model's own rollouts, its VAE frozen "
                                 "(worldstep.train.self_forcing): replaces the VAE, data and dynamics phases",
                                 default=None, metavar="CHECKPOINT")
    own_windows: int = 16
    """windows of each own rollout (--init-from)"""
    own_rollouts: int = 256
    """own rollouts per round, from the DAgger seed range (--init-from)"""
    context_level: float = 0.0
    """max flow level of noise on the committed context, given to the model as its timestep, drawn per clip
    (--init-from; 0: off); a model tuned with it rolls out with the rollout knob context_noise"""
    refresh_every: int = 0
    """steps between rounds of own rollouts, each made with the weights reached so far (--init-from; 0: one round)"""
    export_only: str | None = flag("write a checkpoint from --out's latest phase checkpoints (EMA weights) to DIR "
                                   "and exit; safe while the run continues", default=None, metavar="DIR")


def parse_args(argv: list[str] | None) -> TrainArgs:
    args = parse_flags(TrainArgs, argv, prog="python -m worldstep.train", description=__doc__)
    if args.chunk not in (4, 8):
        raise ValueError(f"chunk={args.chunk} is invalid; allowed: 4 or 8")
    if args.windows < 1 or args.budget_minutes <= 0 or not 0 < args.vae_share < 1:
        raise ValueError("windows >= 1, budget-minutes > 0 and 0 < vae-share < 1 are required")
    if not 0 <= args.vae_long_share <= 1:
        raise ValueError(f"vae-long-share={args.vae_long_share} is invalid; allowed: 0..1")
    if (args.vae_long_frames - 1) % 4 or args.vae_long_frames < 9:
        raise ValueError(f"vae-long-frames={args.vae_long_frames} is invalid; allowed: 1 + 4k >= 9")
    for name in ("own_context_share", "vae_latent_noise"):
        if not 0 <= getattr(args, name) <= 1:
            raise ValueError(f"{name.replace('_', '-')}={getattr(args, name)} is invalid; allowed: 0..1")
    for name in ("moving_weight", "context_noise"):
        if getattr(args, name) < 0:
            raise ValueError(f"{name.replace('_', '-')}={getattr(args, name)} is invalid; allowed: >= 0")
    for name in ("vae_steps", "dyn_steps", "dagger_clips"):
        if getattr(args, name) < 0:
            raise ValueError(f"{name.replace('_', '-')}={getattr(args, name)} is invalid; allowed: >= 0")
    if args.stop_after_minutes < 0:
        raise ValueError(f"stop-after-minutes={args.stop_after_minutes} is invalid; allowed: >= 0 (0: no limit)")
    for name in ("own_windows", "own_rollouts"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name.replace('_', '-')}={getattr(args, name)} is invalid; allowed: >= 1")
    if not 0 <= args.context_level < 1:
        raise ValueError(f"context-level={args.context_level} is invalid; allowed: 0 <= level < 1 (0: off)")
    if args.refresh_every < 0:
        raise ValueError(f"refresh-every={args.refresh_every} is invalid; allowed: >= 0 (0: one round)")
    if args.init_from is not None and not all((Path(args.init_from) / part / "config.json").exists()
                                              for part in ("transformer", "vae")):
        raise ValueError(f"init-from={args.init_from!r} is invalid; allowed: a diffusers checkpoint folder with "
                         "transformer/ and vae/ (e.g. runs/pusher5/checkpoint)")
    if args.init_from is not None and args.dyn_steps < 1:
        raise ValueError(f"dyn-steps={args.dyn_steps} is invalid with --init-from; allowed: >= 1 (a fixed step count)")
    if args.dagger_clips > args.num_clips:
        raise ValueError(f"dagger-clips={args.dagger_clips} is invalid; allowed: 0..num-clips ({args.num_clips})")
    return args


# Arguments a resumed run may change: they set how this stretch runs, not what it computes.
STRETCH_ARGS = ("resume", "stop_after_minutes", "threads", "export_only")


def check_resume_args(args: TrainArgs, saved: dict[str, Any]) -> None:
    """A resumed run must compute what the run it continues computed: refuse any other changed argument."""
    changed = {k: (saved[k], v) for k, v in asdict(args).items()
               if k not in STRETCH_ARGS and k in saved and saved[k] != v}
    if changed:
        spelled = ", ".join(f"--{k.replace('_', '-')} {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items()))
        raise ValueError(f"--resume with changed arguments ({spelled}); allowed: the run's own arguments, except "
                         f"{', '.join('--' + k.replace('_', '-') for k in STRETCH_ARGS)}")


class StretchEnded(Exception):
    """The stretch's wall time is spent; the phase checkpointed the step it reached."""


class Stretch:
    """The wall time of one working stretch of a long run (`--stop-after-minutes`)."""

    def __init__(self, minutes: float) -> None:
        self.deadline = time.monotonic() + minutes * 60 if minutes > 0 else None

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


def architectures(small: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(transformer, vae) constructor kwargs; `small` shrinks both for smoke tests."""
    t, v = dict(TRANSFORMER_ARCH), dict(VAE_ARCH)
    if small:
        t.update(hidden_size=32, intermediate_size=64, head_dim=16, num_hidden_layers=1, latent_channel=4,
                 patch_latent_dim=4, rope_axes_dim=[4, 2, 2])
        v.update(base_dim=4, decoder_base_dim=4, z_dim=4, dim_mult=[1, 1, 1, 1])
    return t, v


class RunLog:
    """Append-only JSONL loss log plus wall-clock accounting per phase."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, **record: Any) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def cosine_lr(base: float, progress: float, step: int, warmup: int = 50) -> float:
    """Linear warmup over `warmup` steps, constant to 70% of the phase, then cosine down to 5%.

    The phase is time-based on a shared CPU whose speed varies 10x; a cosine over the whole phase
    decays the rate during slow stretches and leaves the fast ones with nothing (seen: a VAE whose
    last 200 of 260 steps ran below 2e-5).
    """
    if step < warmup:
        return base * (step + 1) / warmup
    if progress < 0.7:
        return base
    tail = min(1.0, (progress - 0.7) / 0.3)
    return base * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * tail)))


def _save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


class PhaseBudget:
    """Where a phase stands: a fixed step count, or wall time against a budget (the CPU is shared, so a
    step-count plan made from a few probe steps is fragile; time-based phases always end on time)."""

    def __init__(self, budget_s: float, fixed_steps: int, step: int = 0, elapsed: float = 0.0) -> None:
        self.budget_s, self.fixed_steps, self.step, self.elapsed = budget_s, fixed_steps, step, elapsed
        self._mark = time.perf_counter()

    @property
    def fraction(self) -> float:
        if self.fixed_steps > 0:
            return self.step / self.fixed_steps
        return (self.elapsed + time.perf_counter() - self._mark) / self.budget_s

    def advance(self) -> None:
        self.step += 1

    def state(self) -> dict[str, float]:
        return {"step": self.step, "elapsed": self.elapsed + time.perf_counter() - self._mark}


# --- VAE ---------------------------------------------------------------------------------------


def train_vae(args: TrainArgs, clips, held, vae_arch, log: RunLog, out: Path, budget_s: float,
              stretch: Stretch | None = None):
    from worldstep.engine.vae import frames_from_pixels
    from worldstep.fidelity.metrics import psnr  # the one PSNR (lazy: worldstep.fidelity imports train.data)

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
            _save(state_path, {"model": vae.state_dict(), "opt": opt.state_dict(), "rng": rng.bit_generator.state,
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
    _save(state_path, {"model": vae.state_dict(), **prog.state(), "done": True, "config": dict(vae.config)})
    return vae


# --- dynamics ----------------------------------------------------------------------------------


def text_ids(tokenizer, chunk: int) -> torch.Tensor:
    """The prompt ids a worldstep session prefills for this model (same caption, same template)."""
    from worldstep.engine.models.cosmos3.prompt import tokenize_action_prompt

    tokens = tokenize_action_prompt(tokenizer, PROMPT, "", view_point="ego_view", num_frames=chunk + 1, fps=FPS,
                                    height=SIZE, width=SIZE)
    return torch.tensor(tokens.cond, dtype=torch.long)


def make_transformer(arch: dict[str, Any], seed: int):
    from diffusers import Cosmos3OmniTransformer

    torch.manual_seed(seed)
    return Cosmos3OmniTransformer(**arch)


def dyn_batch(latents: torch.Tensor, actions: np.ndarray, idx: np.ndarray, action_dim: int,
              gen: torch.Generator, windows: int, cells: torch.Tensor | None = None,
              moving_weight: float = 0.0) -> DynamicsBatch:
    """A batch of clips `idx`; with `cells` `[N, T, h, w]` (bool, `moving_cells`) the loss weighs the
    cells the effector or block covers `1 + moving_weight`, the rest 1."""
    z = latents[idx]
    a = torch.zeros(len(idx), actions.shape[1], action_dim)
    a[:, :, :2] = torch.from_numpy(actions[idx])
    weights = None
    if cells is not None and moving_weight > 0:
        weights = 1.0 + moving_weight * cells[idx][:, None, 1:].float()  # [B, 1, T-1, h, w]
    return DynamicsBatch(z, a, sample_sigmas(gen, (len(idx), windows)), torch.randn(z.shape, generator=gen),
                         weights)


def clip_cells(clips: ClipSet, count: int, latent_hw: tuple[int, int]) -> torch.Tensor:
    """`[count, T, h, w]` bool `moving_cells` of the first `count` clips at the latent grid."""
    cell = SIZE // latent_hw[1]
    return torch.from_numpy(np.stack([moving_cells(clips.starts[i], clips.actions[i], cell)
                                      for i in range(count)]))


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
        _save(state_path, {"model": tr.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(),
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


def export_checkpoint(path: Path, transformer, vae, tokenizer) -> Path:
    """Write the diffusers layout `Cosmos3WorldModel.from_pretrained` reads, plus `worldstep.json`."""
    from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler
    from worldstep.engine.models.cosmos3.checkpoint import SCHEDULER_CONFIG

    pipeline = Cosmos3OmniPipeline(
        transformer=transformer, text_tokenizer=tokenizer, vae=vae,
        scheduler=UniPCMultistepScheduler(**SCHEDULER_CONFIG), enable_safety_checker=False,
        default_use_system_prompt=False, use_native_flow_schedule=True,
    )
    pipeline.save_pretrained(path, safe_serialization=True)
    (path / "worldstep.json").write_text(json.dumps({"height": SIZE, "width": SIZE, "fps": FPS,
                                                     "prompt": PROMPT, "domain_id": DOMAIN_ID,
                                                     "config": "pusher", "builtin_embodiments": False,
                                                     "embodiments": [EMBODIMENT]}, indent=2))  # run settings
    return path


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
    return export_checkpoint(target, transformer.eval(), vae.eval(), tokenizer)


def _head(clips: ClipSet, count: int) -> ClipSet:
    return ClipSet(clips.starts[:count], clips.actions[:count])


def dagger_round(args: TrainArgs, steps: int, out: Path, log: RunLog) -> ClipSet:
    """The DAgger round's clips (cached in the run folder, so a resumed run reuses them)."""
    from worldstep.engine.models.cosmos3 import RolloutKnobs
    from worldstep.fidelity.seeds import DAGGER
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
        from .self_forcing import export_snapshot as export_fine_tune

        return export_fine_tune(args, Path(args.export_only), build_tokenizer)
    if args.export_only:
        return export_snapshot(args, Path(args.export_only))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = start_log(args, out)
    stretch = Stretch(args.stop_after_minutes)
    try:
        if args.init_from is not None:
            from .self_forcing import fine_tune

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
        _save(latents_path, {"train": latents, "held": held_latents})
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
    path = export_checkpoint(out / "checkpoint", transformer, vae, tokenizer)
    log.write(event="exported", path=str(path), seconds=time.perf_counter() - start)
    return path
