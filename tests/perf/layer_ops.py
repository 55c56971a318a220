"""Count the torch ops that launch work in one generation layer of a rollout forward.

    python tests/perf/layer_ops.py [--json out.json]

A launch-bound forward on a GPU costs about one kernel launch per torch op that does work, so the count of such ops
per layer is what the fused layer (issue 47) lowers. The count is taken on the CPU, between attention calls: from
the end of layer i's attention call to the start of layer i+1's, which is exactly one layer's work outside attention
(its output projection, residual, MLP, norms, projections and rotary). A torch op is each call that reaches torch
from Python (a ``TorchFunctionMode`` sees ``F.linear``, ``F.rms_norm``, ``x * y`` ...; what an op does inside is not
counted again), and it launches work when what it dispatches includes at least one ATen op that is not a view
(``OpOverload.is_view``) or an allocation: ``x.unflatten`` or ``x[..., :8]`` launch nothing, ``F.rms_norm`` launches
(one fused kernel on CUDA; on the CPU it decomposes, but it is one op here, as on the GPU).

The model is the diffusers transformer at a config's layer shapes (random weights), two rows of packed window
tokens, one with committed context, through `gen_forward` as a denoise step runs it; warm once, count the second.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
from layer_calls import CONFIGS, forward_inputs, transformer_at  # noqa: E402

NO_WORK = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "lift_fresh",
           "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "_local_scalar_dense"}


def _launches(func) -> bool:
    return not func.is_view and func.overloadpacket.__name__ not in NO_WORK


class _Launches(TorchDispatchMode):
    """Whether anything dispatched under it did work."""

    def __init__(self) -> None:
        super().__init__()
        self.any = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.any = self.any or _launches(func)
        return func(*args, **(kwargs or {}))


class OpLog(TorchFunctionMode):
    """Every torch op called from Python, in order, as (name, launches work); `mark` notes attention calls."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, bool]] = []
        self.marks: list[tuple[str, int]] = []
        self.paused = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.paused:
            return func(*args, **(kwargs or {}))
        with _Launches() as launches:
            out = func(*args, **(kwargs or {}))
        self.ops.append((getattr(func, "__name__", str(func)), launches.any))
        return out

    def mark(self, what: str) -> None:
        self.marks.append((what, len(self.ops)))


def layer_ops(config: str, layers: int = 3) -> dict:
    """The ops of one layer between attention calls (layer 1 to 2 of a `layers`-layer model), with their names."""
    from worldstep.engine.models.cosmos3 import layers as layers_module

    transformer = transformer_at(config, layers)
    hidden, cos, sin, batch = forward_inputs(transformer, layers)

    log = OpLog()
    real = layers_module.paged_attention

    def marked(*args, **kwargs):
        log.mark("attention_start")
        log.paused = True  # what attention does inside is not the layer's count
        try:
            out = real(*args, **kwargs)
        finally:
            log.paused = False
        log.mark("attention_end")
        return out

    layers_module.paged_attention = marked
    try:
        with torch.no_grad():
            layers_module.gen_forward(transformer, hidden, cos, sin, batch)  # warm: gathers, cached weights
            log.marks.clear()
            with log:
                layers_module.gen_forward(transformer, hidden, cos, sin, batch)
    finally:
        layers_module.paged_attention = real
    ends = [i for what, i in log.marks if what == "attention_end"]
    starts = [i for what, i in log.marks if what == "attention_start"]
    if len(ends) != layers or len(starts) != layers:
        raise RuntimeError(f"expected {layers} attention calls, saw {len(starts)}")
    between = log.ops[ends[0]:starts[1]]
    return {"config": config, "ops": len(between), "launching": sum(launch for _, launch in between),
            "names": [name + ("" if launch else " (view)") for name, launch in between]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures = [layer_ops(name) for name in CONFIGS]
    for f in figures:
        print(f"{f['config']}: {f['launching']} ops that launch work per layer ({f['ops']} torch ops)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
