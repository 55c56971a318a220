"""GPU check 0: the installed kit, and flashinfer's modules made ready (prebuilt, cached or compiled now).

    python tests/gpu/check_kit.py [--device cpu] [--out DIR]          # kit.json: versions, prebuilt modules found
    python tests/gpu/check_kit.py --ready [--device cpu] [--out DIR]  # flashinfer_ready.json

The inventory records the versions the checks run with and, for each module of `flashinfer_modules.py`,
whether flashinfer finds a prebuilt .so from the kit (``aot``) or one in the JIT workspace (``jit_cached``).
The kit's MANIFEST records of its prebuilt modules must match what `flashinfer_modules.expected()` asks for
(name, generator and arguments, flashinfer version, the installed .so's sha256: `kit_manifest.py`), and
every installed prebuilt module must pass `ldd -r` and load through `tvm_ffi.load_module` in a fresh
process (`prebuilt.py`; without a driver, the kit's stub serves as libcuda.so.1). `--ready` on CUDA runs one Edge-shaped
flashinfer attention batch, which loads (or compiles) them, and records how long that took and what
flashinfer compiled (its `FLASHINFER_JIT_BUILD_LOG`); on the CPU it runs nvcc's preprocessor over every
source of every module against the installed, trimmed flashinfer tree instead: a header missing from the
kit fails here, not on the GPU.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from figures import parse_args, resolve_device, write

PACKAGES = ("torch", "numpy", "transformers", "diffusers", "accelerate", "huggingface-hub", "tokenizers",
            "safetensors", "pydantic", "pydantic-core", "gymnasium", "flashinfer-python", "apache-tvm-ffi",
            "worldstep", "typing-extensions", "requests", "ninja")


def versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def toolchain() -> dict:
    nvcc = shutil.which("nvcc") or str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
    text = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout if Path(nvcc).exists() else ""
    return {"nvcc": nvcc if text else None, "nvcc_version": text.strip().splitlines()[-1] if text else None,
            "cuda_home": os.environ.get("CUDA_HOME"), "extra_cuda_flags": os.environ.get("FLASHINFER_EXTRA_CUDAFLAGS"),
            "ninja": shutil.which("ninja")}


def warm_up(device: torch.device) -> float:
    """One flashinfer batch at Edge geometry (two rows with context, one without): loads every module."""
    from worldstep.engine.attention import AttentionBackendName, PagedAttentionBatch, paged_attention, prime
    from worldstep.engine.kv import PagedKVCache, StreamKey, StreamLabel

    cache = PagedKVCache(num_layers=1, num_pages=16, page_size=128, num_kv_heads=8, head_dim=128,
                                   dtype=torch.bfloat16, device=device)
    for name, n in (("a", 300), ("b", 129)):
        cache.create_stream(StreamKey(name, StreamLabel.MAIN))
        k = torch.randn(1, n, 8, 128, device=device, dtype=torch.bfloat16)
        cache.append(StreamKey(name, StreamLabel.MAIN), k, k)
    cache.create_stream(StreamKey("c", StreamLabel.MAIN))
    tables = [cache.page_table(StreamKey(n, StreamLabel.MAIN)) for n in "abc"]
    start = time.perf_counter()
    batch = PagedAttentionBatch(cache, tables, [394, 200, 394], AttentionBackendName.FLASHINFER)
    q = torch.randn(988, 16, 128, device=device, dtype=torch.bfloat16)
    kv = torch.randn(988, 8, 128, device=device, dtype=torch.bfloat16)
    out = paged_attention(q, kv, kv, prime(batch, 16), 0)
    torch.cuda.synchronize(device)
    if not torch.isfinite(out).all():
        raise RuntimeError("flashinfer returned NaN/inf in the warm-up batch")
    return time.perf_counter() - start


def sources_complete() -> dict:
    """nvcc's preprocessor over every module source, against the installed flashinfer (no compile)."""
    import flashinfer_modules
    from build_kit import compile_argv, nvcc_path, preprocess_deps

    if nvcc_path() is None:
        return {"checked": False, "reason": "no nvcc on this machine"}
    import flashinfer

    root = Path(flashinfer.__file__).resolve().parent
    out = {"checked": True, "ok": True, "modules": {}}
    for spec in flashinfer_modules.specs():
        start, headers = time.perf_counter(), set()
        try:
            for entry in spec.get_compile_commands():
                if entry["file"].endswith(".cu"):
                    headers |= preprocess_deps(compile_argv(entry), root)
        except subprocess.CalledProcessError as err:
            out["ok"] = False
            out["modules"][spec.name] = {"error": str(err.stderr)[-1500:]}
            continue
        out["modules"][spec.name] = {"sources": len(spec.sources), "headers_from_kit": len(headers),
                                     "seconds": round(time.perf_counter() - start, 1)}
    return out


def kit_folder() -> Path:
    return Path(os.environ.get("GPU_KIT", "gpukit")).resolve()


def prebuilt_records() -> list[dict]:
    """The modules the kit says it prebuilt (`GPU_KIT`/MANIFEST.json), as `kit_manifest.record` wrote them."""
    manifest = kit_folder() / "MANIFEST.json"
    if not manifest.exists():
        return []
    return json.loads(manifest.read_text())["flashinfer"].get("modules", [])


def prebuilt(device: torch.device) -> dict:
    """The kit's records against what this checkout asks for, then every installed prebuilt module loaded.

    Without a driver (`--device cpu`) the kit's stub stands in as libcuda.so.1 (prebuilt.py).
    """
    import flashinfer
    import flashinfer_modules
    import kit_manifest
    import prebuilt as loader

    records = prebuilt_records()
    site = Path(flashinfer.__file__).resolve().parents[1]
    installed = {r["name"]: site / r["path"] for r in records}
    problems = kit_manifest.check(records, flashinfer_modules.expected(), installed)
    with tempfile.TemporaryDirectory(prefix="libcuda-stub-") as tmp:
        stub = loader.stub_as_libcuda(kit_folder() / "cuda-stubs", Path(tmp)) if device.type != "cuda" else None
        env = loader.load_env(loader.library_dirs(stub))
        loads = [{"name": name, **loader.check(so, env)} for name, so in installed.items() if so.exists()]
    return {"records": records, "problems": problems, "loads": loads, "stub_libcuda": stub is not None,
            "ok": not problems and all(load["ok"] for load in loads)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv, extra=lambda p: p.add_argument(
        "--ready", action="store_true", help="make flashinfer's modules ready (GPU) / check their sources (CPU)"))
    return ready(args) if args.ready else inventory(args)


def inventory(args) -> int:
    """What is installed, and whether flashinfer finds the kit's prebuilt modules (no kernel runs)."""
    device = resolve_device(args)
    doc = {"python": sys.version.split()[0], "versions": versions(), "toolchain": toolchain(),
           "cuda_available": torch.cuda.is_available()}
    if device is None:
        write(args.out, "kit", {**doc, "ok": False, "reason": "CUDA is not available"})
        return 1
    import flashinfer_modules

    doc["missing"] = [name for name, v in doc["versions"].items() if v is None]
    doc["jit_workspace"] = flashinfer_modules.workspace()
    doc["modules"] = [vars(s) for s in flashinfer_modules.states()]
    doc["kit_prebuilt"] = sorted(r["name"] for r in prebuilt_records())
    doc["prebuilt_found"] = sorted(s["name"] for s in doc["modules"] if s["aot"])
    write(args.out, "kit", {**doc, "ok": False, "partial": True})
    doc["prebuilt"] = prebuilt(device)
    ok = (not doc["missing"] and set(doc["kit_prebuilt"]) <= set(doc["prebuilt_found"]) and doc["prebuilt"]["ok"])
    write(args.out, "kit", {**doc, "ok": ok})
    for problem in doc["prebuilt"]["problems"]:
        print(f"kit: {problem}")
    for load in doc["prebuilt"]["loads"]:
        state = "loaded, ldd -r clean" if load["ok"] else f"FAILED {load['ldd_problems']} {load['load_error']}"
        print(f"prebuilt {load['name'][:48]}: {state}")
    for s in doc["modules"]:
        where = "prebuilt (kit)" if s["aot"] else "JIT cache" if s["jit_cached"] else "to compile"
        print(f"flashinfer module {s['name'][:48]}: {where}")
    print(f"kit: {'ok' if ok else 'FAILED'}; missing packages: {doc['missing'] or 'none'}; prebuilt in kit: "
          f"{len(doc['kit_prebuilt'])}, found by flashinfer: {len(doc['prebuilt_found'])}")
    return 0 if ok else 1


def ready(args) -> int:
    """GPU: load (or compile) every module through one attention batch. CPU: their sources are complete."""
    device = resolve_device(args)
    if device is None:
        write(args.out, "flashinfer_ready", {"ok": False, "reason": "CUDA is not available"})
        return 1
    import flashinfer_modules

    doc = {"dry_run": device.type != "cuda", "jit_workspace": flashinfer_modules.workspace(),
           "modules_before": [vars(s) for s in flashinfer_modules.states()]}
    if device.type == "cuda":
        doc["warm_up_s"] = round(warm_up(device), 2)
        doc["modules_after"] = [vars(s) for s in flashinfer_modules.states()]
        log = os.environ.get("FLASHINFER_JIT_BUILD_LOG")
        doc["jit_builds"] = ([json.loads(line) for line in Path(log).read_text().splitlines()]
                             if log and Path(log).exists() else [])
        ok = all(s["aot"] or s["jit_cached"] for s in doc["modules_after"])
    else:
        doc["sources"] = sources_complete()
        ok = doc["sources"].get("ok", False)
    write(args.out, "flashinfer_ready", {**doc, "ok": ok})
    print(f"flashinfer ready: {'ok' if ok else 'FAILED'}; warm-up {doc.get('warm_up_s', '-')} s; "
          f"compiled now: {[b['name'][:40] for b in doc.get('jit_builds', [])]}; sources: {doc.get('sources', '-')}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
