"""`python -m worldstep.train`: simulator clips -> VAE -> latents -> forward dynamics -> diffusers checkpoint.

Every phase checkpoints into `--out` and `--resume` continues where a run stopped. The default run is a
fixed number of steps per phase (`--vae-steps`, `--dyn-steps`), so its result does not depend on how
busy the machine is; with a phase's steps set to 0 it runs for its share of `--budget-minutes` instead.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..flags import flag, parse_flags


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
    own_targets: str = "replay"
    """targets of the own-context batches (--init-from): replay (the simulator replaying the true start with the
    same actions) or reanchored (the simulator stepped from the state the model's own last frame shows; the
    replay-context batches keep the replay's targets)"""
    export_only: str | None = flag("write a checkpoint from --out's latest phase checkpoints (EMA weights) to DIR "
                                   "and exit; safe while the run continues", default=None, metavar="DIR")


OWN_TARGETS = ("replay", "reanchored")


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
    if args.own_targets not in OWN_TARGETS:
        raise ValueError(f"own-targets={args.own_targets!r} is invalid; allowed: "
                         f"{' or '.join(repr(t) for t in OWN_TARGETS)}")
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
    """A resumed run must compute what the run it continues computed: refuse any other changed argument. A flag
    added after the run started counts at its default (what the run computed)."""
    before = asdict(TrainArgs()) | saved
    changed = {k: (before[k], v) for k, v in asdict(args).items()
               if k not in STRETCH_ARGS and before[k] != v}
    if changed:
        spelled = ", ".join(f"--{k.replace('_', '-')} {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items()))
        raise ValueError(f"--resume with changed arguments ({spelled}); allowed: the run's own arguments, except "
                         f"{', '.join('--' + k.replace('_', '-') for k in STRETCH_ARGS)}")


def run_value(args: TrainArgs, name: str) -> Any:
    """`name` as the run in `args.out` was started with (its `args.json`), else `args`'s: an `--export-only` call
    need not repeat the run's flags for the export to describe the run."""
    import json

    saved = Path(args.out) / "args.json"
    return json.loads(saved.read_text()).get(name, getattr(args, name)) if saved.is_file() else getattr(args, name)
