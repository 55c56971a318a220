"""`python -m worldstep.fidelity`: does the world model tell the truth about the pusher simulator?

Open loop: held-out action sequences from the same start frames through the simulator and the model
(kv and chained windows), scored per window by PSNR, SSIM and object-centroid error, against two
controls (shuffled actions, copying the first frame). Closed loop: graded scripted policies judged
by the same pixel detector in both worlds; the model is useful for policy selection when its success
rates rank the policies like the simulator does (Spearman).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from worldstep.envs.push_sim import render_state
from worldstep.train.data import generate_clips, rollout_states

from .metrics import object_errors, pearson, psnr, spearman, ssim
from .plots import bar_chart, line_chart, side_by_side_mp4
from .policies import graded_policies
from .rollouts import RolloutSettings, model_episodes, open_loop, sim_episodes

_PRESETS = {
    "small": {"clips": 2, "windows": 2, "episodes": 1, "policy_windows": 2, "num_steps": 1, "video_clips": 1},
    "full": {"clips": 32, "windows": 16, "episodes": 10, "policy_windows": 16, "num_steps": 4, "video_clips": 3},
}
TINY_64 = {  # the embedded tiny architecture at 64x64, for `--budget small` without a checkpoint
    "transformer": {"hidden_size": 32, "intermediate_size": 64, "head_dim": 16, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "num_hidden_layers": 2, "latent_channel": 4, "latent_patch_size": 2,
                    "patch_latent_dim": 16, "vocab_size": 128, "rope_axes_dim": [4, 2, 2], "hidden_act": "relu2",
                    "qk_norm_for_text": False, "use_und_k_norm_for_gen": True, "action_gen": True, "action_dim": 16,
                    "num_embodiment_domains": 32, "base_fps": 24},
    "vae": {"base_dim": 8, "decoder_base_dim": 8, "z_dim": 4, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1,
            "temperal_downsample": [False, True, True], "is_residual": True, "in_channels": 12, "out_channels": 12,
            "patch_size": 2, "scale_factor_spatial": 16, "scale_factor_temporal": 4},
    "height": 64, "width": 64, "fps": 24,
}
TARGETS = {"psnr_window1_db": 25.0, "true_beats_shuffled_share": 0.95, "policy_spearman": 0.9}


@dataclass
class FidelityArgs:
    checkpoint: str | None
    out: str
    budget: str
    clips: int
    windows: int
    episodes: int
    policy_windows: int
    num_steps: int
    video_clips: int
    context_frames: int
    flow_shift: float
    seed: int
    threads: int
    workers: int


def parse_args(argv: list[str] | None) -> FidelityArgs:
    p = argparse.ArgumentParser(prog="python -m worldstep.fidelity", description=__doc__)
    p.add_argument("--checkpoint", help="diffusers-layout folder (default with --budget small: a tiny random one)")
    p.add_argument("--out", default="runs/fidelity", help="report folder (JSON, PNGs, mp4)")
    p.add_argument("--budget", choices=sorted(_PRESETS), default="full", help="preset sizes below")
    for name in ("clips", "windows", "episodes", "policy_windows", "num_steps", "video_clips"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=f"override the preset's {name}")
    p.add_argument("--context-frames", type=int, default=4, help="rollout context_frames (the model's config)")
    p.add_argument("--flow-shift", type=float, default=5.0, help="rollout flow_shift")
    p.add_argument("--seed", type=int, default=0, help="held-out clips, episode starts and model noise")
    p.add_argument("--threads", type=int, default=2, help="torch threads per process")
    p.add_argument("--workers", type=int, default=1, help="processes for model rollouts (1: inline)")
    ns = vars(p.parse_args(argv))
    preset = _PRESETS[ns["budget"]]
    for key, value in preset.items():
        if ns[key] is None:
            ns[key] = value
    args = FidelityArgs(**ns)
    if args.checkpoint is None and args.budget != "small":
        p.error("--checkpoint is required unless --budget small")
    return args


def _resolve(args: FidelityArgs, out: Path) -> tuple[Path, RolloutSettings]:
    """The checkpoint folder (a tiny random one is built for `--budget small`) and the rollout settings."""
    from worldstep.engine.models.cosmos3 import build_checkpoint

    path = Path(args.checkpoint) if args.checkpoint else out / "tiny-random-checkpoint"
    if args.checkpoint is None and not (path / "model_index.json").exists():
        build_checkpoint(path, TINY_64, seed=args.seed)
    meta = json.loads((path / "worldstep.json").read_text()) if (path / "worldstep.json").exists() else {}
    settings = RolloutSettings(prompt=meta.get("prompt", "A robot pushes a block to the goal."),
                               domain_id=int(meta.get("domain_id", 0)), num_steps=args.num_steps,
                               context_frames=args.context_frames, flow_shift=args.flow_shift)
    return path, settings


def _run_task(path: str, threads: int, settings: RolloutSettings, task: tuple) -> Any:
    """One unit of model work, in this process or a worker: ("open_loop", mode, first, actions, seed) or
    ("episodes", policy_ids, seeds, max_windows). Loads its own model (workers share nothing)."""
    from worldstep.engine.models.cosmos3 import Cosmos3WorldModel
    from worldstep.world import resolve_config

    torch.set_num_threads(threads)
    decoder = resolve_config(path).decoder  # as the folder's config decodes (worldstep.json)
    world = Cosmos3WorldModel.from_pretrained(path, device="cpu", page_size=4, num_pages=32768,
                                              decoder_options=decoder)
    try:
        if task[0] == "open_loop":
            _, mode, first, actions, seed = task
            return open_loop(world, first, actions, settings, mode, seed)
        if task[0] == "vae":
            return _reconstruct(world.vae, task[1])
        _, ids, seeds, max_windows = task
        policies = [graded_policies(settings.chunk_size)[i] for i in ids]
        return model_episodes(world, policies, seeds, max_windows, settings, policy_ids=ids)
    finally:
        world.close_all()


@torch.no_grad()
def _reconstruct(vae, frames: np.ndarray) -> np.ndarray:
    """VAE round trip of whole clips `[N, 1 + T, H, W, 3]` -> frames 1..T: the ceiling of any rollout."""
    out = []
    for clip in frames:
        x = torch.from_numpy(clip).float().div(127.5).sub(1).permute(3, 0, 1, 2)[None]  # [1, 3, T, H, W]
        y = vae.decode(vae.encode(x).latent_dist.mean).sample[0].clamp(-1, 1)  # [3, T, H, W]
        out.append(((y.permute(1, 2, 3, 0).numpy() + 1) * 127.5).round().astype(np.uint8)[1:])
    return np.stack(out)


def _run_tasks(path: Path, args: FidelityArgs, settings: RolloutSettings, tasks: list[tuple]) -> list[Any]:
    """Run tasks inline (`--workers 1`) or in spawned worker processes (cost is per session-window, and
    batching sessions does not amortise it on CPU, so separate processes are what scales)."""
    from tqdm.auto import tqdm  # progress on stderr: the report takes minutes

    bar = tqdm(total=len(tasks), desc="fidelity: model rollouts", unit="task")
    try:
        if args.workers <= 1:
            out = []
            for t in tasks:
                out.append(_run_task(str(path), args.threads, settings, t))
                bar.update(1)
            return out
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
            futures = [pool.submit(_run_task, str(path), args.threads, settings, t) for t in tasks]
            for f in futures:
                f.add_done_callback(lambda _: bar.update(1))
            return [f.result() for f in futures]
    finally:
        bar.close()


def _per_window(values: np.ndarray, chunk: int) -> list[float]:
    """`[N, W*chunk]` -> per-window mean over clips and frames (NaN-aware)."""
    n, t = values.shape
    w = values.reshape(n, t // chunk, chunk)
    with warnings.catch_warnings():  # a window where an object is never detected is NaN, on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        return [float(x) for x in np.nanmean(w, axis=(0, 2))]


def _score(pred: np.ndarray, truth: np.ndarray, states: np.ndarray, chunk: int) -> dict[str, Any]:
    n, t = pred.shape[:2]
    flat_p, flat_t = pred.reshape(n * t, *pred.shape[2:]), truth.reshape(n * t, *truth.shape[2:])
    p = psnr(flat_p, flat_t).reshape(n, t)
    s = ssim(flat_p, flat_t).reshape(n, t)
    errs = object_errors(flat_p, states.reshape(n * t, 3, 2))
    eff, blk = errs["effector"].reshape(n, t), errs["block"].reshape(n, t)
    return {
        "psnr_db": _per_window(p, chunk), "ssim": _per_window(s, chunk),
        "effector_error_px": _per_window(eff, chunk), "block_error_px": _per_window(blk, chunk),
        "effector_detected": _per_window(np.isfinite(eff).astype(float), chunk),
        "block_detected": _per_window(np.isfinite(blk).astype(float), chunk),
        "psnr_per_clip": [float(x) for x in p.mean(axis=1)],
    }


def _held_out(settings: RolloutSettings, args: FidelityArgs):
    """Held-out clips (a seed range training never uses): first frames, true frames/states, actions."""
    chunk = settings.chunk_size
    clips = generate_clips(args.clips, args.windows * chunk, seed=args.seed + 777_000)
    truth, states, first = [], [], []
    for start, actions in zip(clips.starts, clips.actions):
        traj = rollout_states(start, actions)
        frames = np.stack([render_state(s) for s in traj])
        first.append(frames[0])
        truth.append(frames[1:])
        states.append(np.stack([np.stack([s.effector, s.block, s.goal]) for s in traj[1:]]))
    return np.stack(first), np.stack(truth), np.stack(states), clips.actions


def _open_loop_tasks(held: tuple, seed: int) -> list[tuple]:
    first, truth, _, actions = held
    shuffled = np.roll(actions, 1, axis=0)  # each clip gets another clip's actions
    return [("open_loop", "kv", first, actions, seed), ("open_loop", "chained", first, actions, seed),
            ("open_loop", "kv", first, shuffled, seed),
            ("vae", np.concatenate([first[:, None], truth], axis=1))]


def _open_loop(outputs: list[np.ndarray], held: tuple, settings: RolloutSettings,
               args: FidelityArgs) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    chunk = settings.chunk_size
    first_a, truth_a, states_a, _ = held
    preds = {
        "kv": outputs[0], "chained": outputs[1], "kv_shuffled_actions": outputs[2],
        "copy_first_frame": np.repeat(first_a[:, None], truth_a.shape[1], axis=1),
        "vae_reconstruction_ceiling": outputs[3],
    }
    scores = {name: _score(pred, truth_a, states_a, chunk) for name, pred in preds.items()}
    true_p = np.array(scores["kv"]["psnr_per_clip"])
    shuf_p = np.array(scores["kv_shuffled_actions"]["psnr_per_clip"])
    summary = {
        "clips": args.clips, "windows": args.windows,
        "true_beats_shuffled_share": float((true_p > shuf_p).mean()) if args.clips > 1 else float("nan"),
        "scores": scores,
    }
    return summary, {"truth": truth_a, **preds}


def _episode_seeds(args: FidelityArgs) -> list[int]:
    return [args.seed + 5_000 + i for i in range(args.episodes)]


def _episode_tasks(args: FidelityArgs, num_policies: int, splits: int) -> list[tuple]:
    groups = [list(range(num_policies))[i::splits] for i in range(splits)]
    return [("episodes", g, _episode_seeds(args), args.policy_windows) for g in groups if g]


def _policies(model_parts: list[list], settings: RolloutSettings, args: FidelityArgs) -> dict[str, Any]:
    policies = graded_policies(settings.chunk_size)
    sim = sim_episodes(policies, _episode_seeds(args), args.policy_windows, settings.chunk_size)
    by_key = {(r.policy, r.seed): r for part in model_parts for r in part}
    model = [by_key[(r.policy, r.seed)] for r in sim]
    names = [p.name for p in policies]

    def rates(results) -> list[float]:
        return [float(np.mean([r.success for r in results if r.policy == n])) for n in names]

    sim_rates, model_rates = rates(sim), rates(model)
    agree = np.mean([a.success == b.success for a, b in zip(sim, model)])
    return {"policies": names, "episodes": args.episodes, "max_windows": args.policy_windows,
            "sim_success": sim_rates, "model_success": model_rates, "episode_agreement": float(agree),
            "spearman": spearman(np.array(sim_rates), np.array(model_rates)),
            "pearson": pearson(np.array(sim_rates), np.array(model_rates))}


def _targets(open_loop_summary: dict[str, Any], ranking: dict[str, Any]) -> dict[str, Any]:
    kv = open_loop_summary["scores"]["kv"]
    return {
        "psnr_window1_db": {"value": kv["psnr_db"][0], "target": TARGETS["psnr_window1_db"],
                            "met": kv["psnr_db"][0] >= TARGETS["psnr_window1_db"]},
        "true_beats_shuffled_share": {"value": open_loop_summary["true_beats_shuffled_share"],
                                      "target": TARGETS["true_beats_shuffled_share"],
                                      "met": open_loop_summary["true_beats_shuffled_share"]
                                      >= TARGETS["true_beats_shuffled_share"]},
        "policy_spearman": {"value": ranking["spearman"], "target": TARGETS["policy_spearman"],
                            "met": bool(ranking["spearman"] >= TARGETS["policy_spearman"])},
        "block_error_growth_px": {"window1": kv["block_error_px"][0], "last_window": kv["block_error_px"][-1]},
        "effector_error_growth_px": {"window1": kv["effector_error_px"][0], "last_window": kv["effector_error_px"][-1]},
    }


def _write_media(out: Path, summary: dict[str, Any], ranking: dict[str, Any], videos: dict[str, np.ndarray],
                 video_clips: int) -> list[str]:
    scores = summary["scores"]
    files = [
        line_chart(out / "psnr.png", {k: v["psnr_db"] for k, v in scores.items()}, "PSNR per window (dB)",
                   "window", "dB"),
        line_chart(out / "ssim.png", {k: v["ssim"] for k, v in scores.items()}, "SSIM per window", "window", "SSIM"),
        line_chart(out / "object_error.png",
                   {f"{k} {obj}": v[f"{obj}_error_px"] for k, v in scores.items() if k in ("kv", "chained")
                    for obj in ("effector", "block")}, "object centroid error per window (px)", "window", "px"),
        bar_chart(out / "policy_success.png", ranking["policies"],
                  {"simulator": ranking["sim_success"], "world model": ranking["model_success"]},
                  f"success rate (Spearman {ranking['spearman']:.2f})", "success"),
    ]
    n = min(video_clips, len(videos["truth"]))
    if n:
        cols = [np.concatenate(list(videos[k][:n]), axis=0) for k in ("truth", "kv", "chained")]
        files.append(side_by_side_mp4(out / "rollouts_sim_kv_chained.mp4", cols))
    return [str(f) for f in files]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the report and write `report.json`, PNG charts and a side-by-side mp4 into `--out`."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    path, settings = _resolve(args, out)
    print(f"fidelity: {path} -> {out} ({args.workers} worker(s)); simulating held-out clips", file=sys.stderr)
    held = _held_out(settings, args)
    open_tasks = _open_loop_tasks(held, args.seed)
    episode_tasks = _episode_tasks(args, len(graded_policies()), max(1, args.workers - 1))
    outputs = _run_tasks(path, args, settings, open_tasks + episode_tasks)
    summary, videos = _open_loop(outputs[: len(open_tasks)], held, settings, args)
    ranking = _policies(outputs[len(open_tasks):], settings, args)
    report = {"checkpoint": str(path), "args": asdict(args), "settings": asdict(settings), "open_loop": summary,
              "policy_ranking": ranking, "targets": _targets(summary, ranking)}
    report["files"] = _write_media(out, summary, ranking, videos, args.video_clips)
    report["seconds"] = time.perf_counter() - start
    (out / "report.json").write_text(json.dumps(_finite(report), indent=2))
    return report


def _finite(value: Any) -> Any:
    """NaN/inf -> None, so report.json is strict JSON (NaN: undefined, e.g. an object never detected)."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
