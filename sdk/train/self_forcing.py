"""Fine-tuning on the model's own rollouts (`python -m worldstep.train --init-from CHECKPOINT`).

A teacher-forced model only ever sees true windows as its committed context, but a rollout commits its
own, imperfect ones, and past the horizon it trained on its errors compound (the fidelity review: false
successes per window grow 20x from windows 1-4 to 9-12). Here the context is what the model committed:

1. Round r: the graded policies and the planner's proposal policy act closed loop on the current model
   (the EMA weights, exported) for `--own-windows` windows from DAgger-range starts; the model's committed
   latents are kept (`dagger.model_loop`).
2. The targets are the latents of the simulator replaying the same start and actions, encoded by the
   checkpoint's (frozen) VAE.
3. Each step trains the flow-matching loss of every window on those targets, with the committed windows
   taken from the model's own rollout (`--own-context-share` of the steps) or from the replay.
4. Every `--refresh-every` steps the rollouts are made again with the weights reached so far.

With `--own-targets replay` (the default) an own-context step still trains toward the replay's windows, which a
drifted context (the block elsewhere) does not predict, so the model may learn to lean on its context less (the
reading offered, not measured apart, for pusher6, whose successes' precision fell from 0.43 to 0.20). With
`--own-targets reanchored` each round also keeps the model's decoded frames, and window w >= 1 of an own-context
step targets what the simulator does from the state the model's own last frame of window w-1 shows (`reanchor`:
DAgger over windows, the simulator the expert of the visited state; windows whose frame lost the effector or block
keep the replay's, counted in the log). The replay-context steps keep the replay's targets, so each pair of
context and targets agrees.

Rounds (with their re-anchored targets), held-out rollouts and the training state live in the run folder, so
`--resume` continues a stretch bit for bit.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from worldstep.envs.push_policies import FLOOR, PixelPushPolicy, graded_policies
from worldstep.envs.push_seeds import DAGGER

from .dagger import model_loop
from .data import ClipSet, clip_cells
from .dynamics import ClipLayout, DynamicsBatch, DynamicsModel, dyn_batch, noised_context
from .pusher import DOMAIN_ID, FPS, PROMPT, export_checkpoint, text_ids
from .reanchor import anchored_cells, fallback_share, reanchored_targets
from .stretches import StretchEnded, cosine_lr, save_state
from .vae import encode_clips

HELD_OFFSET = 9_000  # DAgger-range offset of the held-out rollouts (rounds count up from ROUND_OFFSET)
HELD_COUNT = 32
ROUND_OFFSET = 1_000  # pusher5's DAgger round used offsets 0..599


@dataclass
class OwnRollouts:
    """Rollouts of a model and their simulator replay: `clips` (starts, actions, seeds), the model's committed
    latents `own` and the replay's latents `true`, both `[N, C, 1 + windows, h, w]` normalised; with
    `--own-targets reanchored` also the re-anchored targets `anchored` (like `true`) and their `anchors`
    `[N, windows, 3, 2]` (`reanchor.reanchored_targets`; NaN: the replay's window kept)."""

    clips: ClipSet
    own: torch.Tensor
    true: torch.Tensor
    anchored: torch.Tensor | None = None
    anchors: np.ndarray | None = None

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        state = {"starts": self.clips.starts, "actions": self.clips.actions, "seeds": self.clips.seeds,
                 "own": self.own, "true": self.true}
        if self.anchored is not None:
            state.update(anchored=self.anchored, anchors=self.anchors)
        torch.save(state, tmp)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> OwnRollouts:
        st = torch.load(path, weights_only=False)
        return cls(ClipSet(st["starts"], st["actions"], st["seeds"]), st["own"], st["true"], st.get("anchored"),
                   st.get("anchors"))


def actors(chunk: int) -> list:
    """The eight graded policies and the planner's proposal policy (`fidelity.report`'s planner base, noisy0.8,
    drawing its own candidates: what the planner imagines in its forks)."""
    graded = [p for p in graded_policies(chunk) if p.name not in FLOOR]
    return [*graded, PixelPushPolicy(0.8, chunk, "proposal")]


def collect(checkpoint: str | Path, vae, seeds: list[int], windows: int, chunk: int, prompt: str,
            domain_id: int, own_targets: str = "replay") -> OwnRollouts:
    """Own rollouts of the model in `checkpoint` (its config's rollout knobs) and their replay's latents; with
    `own_targets` "reanchored" also the targets re-anchored on the model's own frames."""
    from worldstep.engine.config import RolloutKnobs
    from worldstep.world import load

    world = load(str(checkpoint), device="cpu")
    rollout = world.config.rollout
    knobs = RolloutKnobs(num_steps=rollout.num_steps, context_frames=rollout.context_frames,
                         flow_shift=rollout.flow_shift)
    try:
        clips, own, frames = model_loop(world.model, seeds, windows * chunk, chunk, prompt, domain_id, knobs,
                                        actors(chunk), keep_frames=own_targets == "reanchored")
    finally:
        world.model.close_all()
    true = encode_clips(vae, clips)  # [N, C, 1 + windows, h, w]
    if true.shape != own.shape:
        raise ValueError(f"own latents {tuple(own.shape)} and replay latents {tuple(true.shape)} differ; allowed: "
                         "a checkpoint whose VAE is the one given")
    if frames is None:
        return OwnRollouts(clips, own, true)
    anchored, anchors = reanchored_targets(vae, clips, frames, true, chunk)
    return OwnRollouts(clips, own, true, anchored, anchors)


def checked_round(data: OwnRollouts, path: Path, own_targets: str) -> OwnRollouts:
    """A round file made for the run's --own-targets (a re-anchored run needs its stored targets)."""
    if own_targets == "reanchored" and data.anchored is None:
        raise ValueError(f"{path} holds no re-anchored targets; allowed with --own-targets reanchored: a round made "
                         "by a run with --own-targets reanchored (start a new --out)")
    return data


class FineTune:
    """The self-forcing phase: its model, EMA, optimiser, generators and where it stands, saved per checkpoint."""

    def __init__(self, args, transformer, layout: ClipLayout, text_ids: torch.Tensor, domain_id: int,
                 latent_hw: tuple[int, int], fps: float) -> None:
        self.args = args
        self.tr = transformer.train()
        self.ema = copy.deepcopy(transformer).requires_grad_(False)
        self.model = DynamicsModel(self.tr, layout, text_ids, domain_id, latent_hw, fps)
        self.ema_model = DynamicsModel(self.ema, layout, text_ids, domain_id, latent_hw, fps)
        self.opt = torch.optim.AdamW(self.tr.parameters(), lr=args.dyn_lr, weight_decay=0.01)
        self.gen = torch.Generator().manual_seed(args.seed + 30)
        self.rng = np.random.default_rng(args.seed + 31)
        self.step, self.elapsed, self.round = 0, 0.0, 0

    def state(self) -> dict:
        return {"model": self.tr.state_dict(), "ema": self.ema.state_dict(), "opt": self.opt.state_dict(),
                "gen": self.gen.get_state(), "rng": self.rng.bit_generator.state, "step": self.step,
                "elapsed": self.elapsed, "round": self.round}

    def load(self, st: dict) -> None:
        self.tr.load_state_dict(st["model"])
        self.ema.load_state_dict(st["ema"])
        self.opt.load_state_dict(st["opt"])
        self.gen.set_state(st["gen"])
        self.rng.bit_generator.state = st["rng"]
        self.step, self.elapsed, self.round = st["step"], st["elapsed"], st["round"]

    def train_step(self, data: OwnRollouts, cells: torch.Tensor, lr: float,
                   anchored_cells: torch.Tensor | None = None) -> float:
        args = self.args
        for group in self.opt.param_groups:
            group["lr"] = lr
        idx = self.rng.integers(len(data.own), size=args.dyn_batch)
        own_context = self.rng.random() < args.own_context_share
        batch, context = self.batch(data, idx, own_context, cells, anchored_cells)
        level = None
        if args.context_level > 0:  # the context noised at a level the model is told (the context_noise knob)
            level = torch.rand(len(idx), generator=self.gen) * args.context_level
            context = noised_context(batch.latents if context is None else context, level, self.gen)
        loss = self.model.loss(batch, context, level)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.tr.parameters(), 1.0)
        self.opt.step()
        with torch.no_grad():
            for pe, p in zip(self.ema.parameters(), self.tr.parameters()):
                pe.lerp_(p, 1 - args.ema)
        return loss.item()

    def batch(self, data: OwnRollouts, idx: np.ndarray, own_context: bool, cells: torch.Tensor,
              anchored_cells: torch.Tensor | None) -> tuple[DynamicsBatch, torch.Tensor | None]:
        """(batch, context) of one step; context None: the replay's (teacher). With --own-targets reanchored an
        own-context batch takes the re-anchored targets, weighed where they show the objects, so context and
        targets agree. Either way it draws the same from `self.gen`."""
        reanchored = own_context and self.args.own_targets == "reanchored"
        targets, weights = (data.anchored, anchored_cells) if reanchored else (data.true, cells)
        batch = dyn_batch(targets, data.clips.actions, idx, self.tr.config.action_dim, self.gen,
                          self.model.layout.windows, weights, self.args.moving_weight)
        return batch, data.own[idx] if own_context else None

    @torch.no_grad()
    def held_loss(self, held: OwnRollouts) -> dict[str, float]:
        """The EMA model's loss on the held-out rollouts, with its own context and with the replay's; with
        re-anchored targets also with its own context on them."""
        g = torch.Generator().manual_seed(1234)
        idx = np.arange(len(held.own))
        batch = dyn_batch(held.true, held.clips.actions, idx, self.tr.config.action_dim, g,
                          self.model.layout.windows)
        out = {"heldout_own_context": self.ema_model.loss(batch, held.own[idx]).item(),
               "heldout_true_context": self.ema_model.loss(batch).item()}
        if held.anchored is not None:
            anchored = DynamicsBatch(held.anchored[idx], batch.actions, batch.sigmas, batch.noise)
            out["heldout_own_context_reanchored"] = self.ema_model.loss(anchored, held.own[idx]).item()
        return out


def fine_tune(args, out: Path, log, stretch, build_tokenizer) -> Path:
    """Run (or resume) the self-forcing phase from `args.init_from`; returns the exported checkpoint."""
    from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer


    init = Path(args.init_from)
    vae = AutoencoderKLWan.from_pretrained(init / "vae").eval().requires_grad_(False)
    transformer = Cosmos3OmniTransformer.from_pretrained(init / "transformer")
    tokenizer = build_tokenizer(int(transformer.config.vocab_size))
    windows, chunk = args.own_windows, args.chunk

    def rollouts(name: str, checkpoint: Path, seeds: list[int]) -> OwnRollouts:
        path = out / f"{name}.pt"
        if path.exists():
            return checked_round(OwnRollouts.load(path), path, args.own_targets)
        t0 = time.perf_counter()
        data = collect(checkpoint, vae, seeds, windows, chunk, PROMPT, DOMAIN_ID, args.own_targets)
        data.save(path)
        extra = {}
        if data.anchors is not None:
            missing, total = fallback_share(data.anchors)
            extra = {"reanchor_fallbacks": missing, "reanchor_windows": total,
                     "fallback_share": missing / total if total else None}
        log.write(phase="own_rollouts", name=name, checkpoint=str(checkpoint), clips=len(seeds),
                  seeds=[seeds[0], seeds[-1]], windows=windows, own_targets=args.own_targets, **extra,
                  seconds=time.perf_counter() - t0, time=time.time())
        return data

    held = rollouts("own_held", init, DAGGER.seeds(HELD_COUNT, HELD_OFFSET))
    per_frame = held.true.shape[-1] * held.true.shape[-2] // transformer.config.latent_patch_size ** 2
    horizon = args.context_frames * (per_frame + chunk) if args.context_frames > 0 else None
    layout = ClipLayout(windows, chunk // 4, chunk, per_frame, horizon)
    ft = FineTune(args, transformer, layout, text_ids(tokenizer, chunk), DOMAIN_ID, tuple(held.true.shape[-2:]), FPS)
    state_path = out / "ft_state.pt"
    if args.resume and state_path.exists():
        ft.load(torch.load(state_path, weights_only=False))
    refresh = args.refresh_every if args.refresh_every > 0 else args.dyn_steps + 1

    def round_data(r: int) -> tuple[OwnRollouts, torch.Tensor, torch.Tensor | None]:
        """(round r, the replay's moving cells, the re-anchored targets' moving cells or None)."""
        source = init
        if r > 0 and not (out / f"own_round{r}.pt").exists():  # the weights reached so far make the round
            source = export_checkpoint(out / "round_checkpoint", copy.deepcopy(ft.ema).eval(), vae, tokenizer,
                                       trained_horizon=trained_horizon(args))
        data = rollouts(f"own_round{r}", source, DAGGER.seeds(args.own_rollouts, ROUND_OFFSET + r * args.own_rollouts))
        cells = clip_cells(data.clips, len(data.own), tuple(data.true.shape[-2:]))
        moved = None if data.anchors is None else anchored_cells(data.clips, data.anchors, cells, chunk)
        return data, cells, moved

    data, cells, moved = round_data(ft.round)
    if ft.step == 0:
        log.write(phase="self_forcing", step=0, **ft.held_loss(held), time=time.time())
    bar = tqdm(desc="self-forcing", initial=ft.step, total=args.dyn_steps, mininterval=5)
    mark = time.perf_counter()
    while ft.step < args.dyn_steps:
        if ft.step > 0 and ft.step % refresh == 0 and ft.round < ft.step // refresh:
            ft.round = ft.step // refresh
            data, cells, moved = round_data(ft.round)
        lr = cosine_lr(args.dyn_lr, ft.step / args.dyn_steps, ft.step, warmup=20)
        loss = ft.train_step(data, cells, lr, moved)
        ft.step += 1
        ft.elapsed += time.perf_counter() - mark
        mark = time.perf_counter()
        bar.update()
        if ft.step % args.log_every == 0:
            log.write(phase="self_forcing", step=ft.step, loss=loss, lr=lr, round=ft.round, time=time.time())
            bar.set_postfix(loss=f"{loss:.4f}")
        stop = stretch.expired() and ft.step < args.dyn_steps
        if ft.step % args.ckpt_every == 0 or stop:
            save_state(state_path, ft.state())
        if ft.step % (5 * args.ckpt_every) == 0:
            log.write(phase="self_forcing", step=ft.step, **ft.held_loss(held), time=time.time())
        if stop:
            log.write(phase="self_forcing", event="stretch_end", step=ft.step, time=time.time())
            raise StretchEnded(f"self-forcing step {ft.step}")
    bar.close()
    save_state(state_path, ft.state())
    log.write(phase="self_forcing", event="done", **ft.held_loss(held), time=time.time())
    return export_checkpoint(out / "checkpoint", ft.ema.eval(), vae, tokenizer, trained_horizon=trained_horizon(args))


def trained_horizon(args) -> int:
    """The fine-tune's trained horizon: the longer of its own rollouts (`--own-windows`) and what the
    `--init-from` checkpoint records (its clips)."""
    from ..trust.signals import trained_horizon_of
    from .args import run_value

    return max(run_value(args, "own_windows"), trained_horizon_of(args.init_from) or 0)


def export_snapshot(args, target: Path, build_tokenizer) -> Path:
    """Export the latest EMA weights of a self-forcing run in `args.out` (in progress or not) with the frozen VAE
    of `args.init_from`; safe while the run goes on."""
    from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer

    state = Path(args.out) / "ft_state.pt"
    if not state.exists():
        raise ValueError(f"{state} is missing; allowed: a self-forcing run past its first checkpoint")
    init = Path(args.init_from)
    transformer = Cosmos3OmniTransformer.from_pretrained(init / "transformer")
    transformer.load_state_dict(torch.load(state, weights_only=False)["ema"])
    vae = AutoencoderKLWan.from_pretrained(init / "vae")
    tokenizer = build_tokenizer(int(transformer.config.vocab_size))
    return export_checkpoint(target, transformer.eval(), vae.eval(), tokenizer, trained_horizon=trained_horizon(args))
