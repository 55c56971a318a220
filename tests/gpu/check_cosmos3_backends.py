"""GPU check: a multi-window Cosmos3 kv rollout on the flashinfer backend matches the sdpa backend.

Run on a CUDA machine with flashinfer installed (`pip install -e .[gpu]`):
    python tests/gpu/check_cosmos3_backends.py
Exits non-zero when the backends disagree beyond bf16 rounding.
"""

from __future__ import annotations

import sys
import tempfile
from importlib.resources import files

import numpy as np
import torch
import yaml
from worldstep.engine.models.cosmos3 import Cosmos3WorldModel, RolloutKnobs, build_checkpoint


def rollout(path, backend: str, dtype: torch.dtype) -> list[torch.Tensor]:
    model = Cosmos3WorldModel.from_pretrained(path, device="cuda", dtype=dtype, attention_backend=backend,
                                              page_size=16, num_pages=512)
    image = np.random.RandomState(0).randint(0, 256, (128, 128, 3), dtype=np.uint8)
    knobs = RolloutKnobs(chunk_size=8, num_steps=4, guidance_scale=2.0, context_frames=3, decode=False)
    outputs = []
    sessions = [model.open_session(image, "push the block", d, knobs=knobs,
                                   generator=torch.Generator().manual_seed(d)) for d in (1, 2)]
    for w in range(6):
        actions = [np.random.RandomState(10 * w + i).uniform(-1, 1, (8, 10)).astype(np.float32) for i in range(2)]
        outputs.extend(r.latents.float() for r in model.step_batch(sessions, actions))
    for s in sessions:
        s.close()
    assert model.kv.num_used_pages == 0
    return outputs


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    arch = yaml.safe_load(files("worldstep.configs").joinpath("tiny.yaml").read_text())["model"]["architecture"]
    arch = {**arch, "transformer": {**arch["transformer"], "head_dim": 64, "hidden_size": 256,
                                    "intermediate_size": 512, "rope_axes_dim": [16, 8, 8]}}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint(f"{tmp}/ckpt", arch)
        worst = 0.0
        for dtype in (torch.bfloat16, torch.float16):
            ref, fi = rollout(path, "sdpa", dtype), rollout(path, "flashinfer", dtype)
            for w, (a, b) in enumerate(zip(ref, fi)):
                rel = ((a - b).abs().max() / a.abs().max().clamp_min(1e-6)).item()
                worst = max(worst, rel)
                print(f"{dtype} window-row {w}: max rel diff {rel:.2e}")
    print(f"worst relative difference: {worst:.3e}")
    return 0 if worst < 5e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
