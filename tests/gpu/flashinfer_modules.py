"""The flashinfer 0.7.4 JIT modules worldstep's `flashinfer` attention backend loads, and their state.

`engine/attention.py` plans `BatchPrefillWithRaggedKVCacheWrapper` and `BatchPrefillWithPagedKVCacheWrapper`
(bf16, NHD, head_dim 128, no mask, no RoPE in the kernel) and merges them with `merge_state`. On an H100/H200
(sm90) flashinfer's `auto` backend runs both prefills through ONE module, the FA3 batch-prefill module, as
long as some row of the batch has more than 64 queries (a Cosmos3-Edge window row has >= 394), and
`merge_state` through the `cascade` module. Used by `build_kit.py` (prebuild, trim the source tree) and by
`check_kit.py` on the GPU (which of them were prebuilt, cached, or compiled now).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

FLASHINFER_VERSION = "0.7.4"
CUDA_ARCH = "9.0a"  # H100 / H200; flashinfer names the JIT workspace after it ("90a")


@dataclass(frozen=True)
class ModuleState:
    name: str
    aot: bool  # a prebuilt .so ships inside the installed flashinfer (data/aot/<name>/<name>.so)
    jit_cached: bool  # a .so already sits in the JIT workspace (FLASHINFER_WORKSPACE_BASE)
    sources: int


# Each module as the flashinfer generator that makes its JitSpec and that generator's arguments, JSON-able
# (dtypes by name): the kit's MANIFEST records them next to each prebuilt .so, and the dry run compares.
# batch prefill: q, kv, o, index dtypes; head_dim_qk, head_dim_vo; pos_encoding NONE; no sliding window,
# no soft cap, no fp16 qk reduction, no sf
RECIPES: tuple[tuple[str, tuple], ...] = (
    ("flashinfer.jit.attention.modules.gen_batch_prefill_module",
     ("fa3", "bfloat16", "bfloat16", "bfloat16", "int32", 128, 128, 0, False, False, False, False)),
    ("flashinfer.jit.cascade.gen_cascade_module", ()),
)


def recipes() -> list[dict]:
    """`RECIPES` as the MANIFEST writes them: {"generator": dotted name, "args": [...]}."""
    return [{"generator": generator, "args": list(args)} for generator, args in RECIPES]


def spec_of(recipe: dict):
    """The `JitSpec` a recipe describes (generating it writes its sources; nothing compiles)."""
    import importlib

    import torch

    module, _, function = recipe["generator"].rpartition(".")
    args = [getattr(torch, a) if a in ("bfloat16", "float16", "float32", "int32", "int64") else a
            for a in recipe["args"]]
    return getattr(importlib.import_module(module), function)(*args)


def specs() -> list:
    """The `JitSpec`s of the modules the backend needs (generating them writes their sources, no compile)."""
    return [spec_of(recipe) for recipe in recipes()]


def expected() -> list[dict]:
    """What the kit must have prebuilt for this flashinfer: each module's name, recipe and flashinfer version."""
    import flashinfer

    return [{"name": spec_of(r).name, **r, "flashinfer": flashinfer.__version__} for r in recipes()]


def states() -> list[ModuleState]:
    return [
        ModuleState(spec.name, bool(spec.is_aot), Path(spec.jit_library_path).exists(), len(spec.sources))
        for spec in specs()
    ]


def workspace() -> str:
    """Where flashinfer's JIT cache lives in this process (set FLASHINFER_WORKSPACE_BASE before importing it)."""
    from flashinfer.jit import env as jit_env

    return str(jit_env.FLASHINFER_WORKSPACE_DIR)


def arch_env() -> dict[str, str]:
    """Environment that makes flashinfer target the H200 when no GPU is visible (prebuilding on a CPU box)."""
    return {**os.environ, "FLASHINFER_CUDA_ARCH_LIST": CUDA_ARCH}
