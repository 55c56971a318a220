"""GPU check, first and in seconds: `worldstep/Tiny-v0` on the device with each attention backend, end to end.

    python tests/gpu/check_smoke.py [--out DIR]                 # exit 0: every backend that can run, ran
    python tests/gpu/check_smoke.py --device cpu --tiny         # dry run: the same path on the CPU (sdpa)

Per backend: load the tiny model on the device, `gym.make("worldstep/Tiny-v0", model=world)`, reset, a step, a
fork (`fork_env`) and a step of the fork, a step of the parent, close both; every frame finite uint8 and every
page back after the close. flashinfer's kernels take bf16 and head_dim 64/128/256, so its run uses the tiny
architecture with head_dim 128 in bf16, at 256x256 (64 tokens a latent frame: a window row has more than 64
queries, so flashinfer picks the FA3 module the kit prebuilt, as for Edge); it runs only where those kernels
load (`flashinfer_problems`), and otherwise the figures say why. Any failure is recorded per backend; the
other backend still runs.
"""

from __future__ import annotations

import copy
import sys
import time
import traceback

import numpy as np
import torch
from figures import parse_args, resolve_device, write

FLASHINFER_HEAD_DIM = 128


def overrides(backend: str) -> dict:
    """The tiny config's overrides for ``backend`` (flashinfer: kernels it has, bf16 and head_dim 128)."""
    base = {"height": 32, "width": 32, "num_steps": 2, "attention_backend": backend}
    if backend != "flashinfer":
        return base
    from worldstep.config import load_config

    arch = copy.deepcopy(load_config("tiny").model.architecture.model_dump())
    arch["transformer"]["head_dim"] = FLASHINFER_HEAD_DIM
    return {**base, "architecture": arch, "dtype": "bfloat16", "height": 256, "width": 256}


def smoke(device: torch.device, backend: str) -> dict:
    """Reset, step, fork, step both, close: what happened, and whether every page came back."""
    import gymnasium as gym
    import worldstep
    from worldstep.envs import fork_env

    start = time.perf_counter()
    world = worldstep.load("tiny", device=str(device), **overrides(backend))
    env = gym.make("worldstep/Tiny-v0", model=world)
    frames = []
    try:
        obs, _ = env.reset(seed=0)
        frames.append(obs["frames"])
        chunk = np.zeros(env.action_space.shape, np.float32)
        frames.append(env.step(chunk)[0]["frames"])
        fork = fork_env(env, seed=1)
        try:
            frames.append(fork.step(chunk + 0.5)[0]["frames"])
        finally:
            fork.close()
        frames.append(env.step(chunk)[0]["frames"])
    finally:
        env.close()
    ok_frames = all(f.dtype == np.uint8 and f.size > 0 for f in frames)
    pages = world.model.kv.num_used_pages
    return {"ran": True, "backend": world.model.backend.value, "device": str(world.model.device),
            "frames_ok": ok_frames, "pages_after_close": pages, "seconds": round(time.perf_counter() - start, 2),
            "ok": ok_frames and pages == 0}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    device = resolve_device(args)
    if device is None:
        write(args.out, "smoke", {"ok": False, "reason": "CUDA is not available"})
        return 1
    from worldstep.engine.attention import flashinfer_problems

    doc: dict = {"dry_run": device.type != "cuda", "device": str(device), "backends": {}}
    for backend in ("sdpa", "flashinfer"):
        problems = flashinfer_problems(device, torch.bfloat16, FLASHINFER_HEAD_DIM) if backend == "flashinfer" else []
        if problems:
            doc["backends"][backend] = {"ran": False, "ok": None, "reason": f"not run: {'; '.join(problems)}"}
        else:
            try:
                doc["backends"][backend] = smoke(device, backend)
            except Exception as err:  # noqa: BLE001 - recorded; the other backend still runs
                doc["backends"][backend] = {"ran": True, "ok": False, "error": f"{type(err).__name__}: {err}"[:2000],
                                            "traceback": traceback.format_exc()[-4000:]}
        write(args.out, "smoke", {**doc, "ok": False, "partial": True})
    ran = [r for r in doc["backends"].values() if r["ran"]]
    ok = bool(ran) and all(r["ok"] for r in ran)
    write(args.out, "smoke", {**doc, "ok": ok})
    for name, r in doc["backends"].items():
        state = "ok" if r["ok"] else r.get("reason") or r.get("error") or f"pages {r.get('pages_after_close')}"
        print(f"smoke {name}: {state}")
    print(f"smoke: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
