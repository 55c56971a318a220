"""Build the GPU kit: what the offline GPU machine lacks, in one git-ignored folder of at most 60 MiB.

    python tests/gpu/build_kit.py [--out gpukit] [--work build/gpukit-work] [--aot auto|on|off]

The GPU image (`image.txt`) has torch, transformers, accelerate, numpy, ... but none of worldstep's other
dependencies and no flashinfer, and at most 64 MiB travels with the checkout. The kit holds:

- ``tools/``: pip, setuptools and wheel, to install offline whatever pip the image has (never installed).
- ``wheels/``: the other pinned wheels of `kit-requirements.txt` (cp312 manylinux x86-64 builds), and
  flashinfer-python 0.7.4 repacked with only what worldstep's backend needs: every Python module that
  `import flashinfer` loads plus the packages the batch-prefill path calls (top level, ``jit``,
  ``attention``, ``trace``), ``data/include``, and from ``data/csrc``, ``data/cutlass``, ``data/cccl`` and
  ``data/spdlog`` the files the JIT reads or that its compiles include (nvcc's own preprocessing of every
  source, host and sm_90a device passes). The full wheel is ~100 MB (855 MB installed).
- ``data/aot`` inside that wheel: the modules of `flashinfer_modules.py` compiled for sm_90a on this
  machine when it has nvcc (`--aot auto`), so the GPU run loads them instead of compiling (flashinfer
  loads ``data/aot/<name>/<name>.so`` before it considers a JIT build). Source JIT stays the fallback.
- ``cuda-include/``: curand headers (CUTLASS includes ``curand_kernel.h``; a pip-assembled CUDA toolkit
  has no curand), passed to a JIT build only when the machine's toolkit lacks them.
- ``cuda-stubs/``: an empty ``libcuda.so`` (SONAME libcuda.so.1) for the link of a JIT build where the
  toolkit has no ``lib64/stubs`` (the driver's libcuda.so.1 serves it at load time).
- ``MANIFEST.json``: every file with its size, the prebuilt modules, and where each part came from.

Downloads and builds are cached under ``--work`` (outside the kit); prebuilding the FA3 module takes
tens of minutes on 2 cores the first time, seconds after.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import kit_manifest  # noqa: E402

ROOT = HERE.parents[1]
PINS = HERE / "kit-requirements.txt"
MAX_MIB = 60
TRAVEL_MIB = 64  # the checkout's tracked files plus the carried kit
CHECKOUT_MAX_MIB = 32  # the checkout's share of TRAVEL_MIB: the kit measured 29.09 MiB (f6f2639), the rest is ours
FLASHINFER = "flashinfer-python==0.7.4"
CURAND = "nvidia-curand>=10.4,<10.5"  # CUDA 13.x
# The GPU image runs CPython 3.12 on glibc 2.39 (Ubuntu 24.04): every manylinux tag up to 2_28 fits.
PLATFORMS = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64"]
# Packages of flashinfer kept whole (the batch-prefill and merge_state paths import lazily inside them);
# elsewhere only the modules `import flashinfer` loads are kept.
WHOLE_PACKAGES = ("jit", "attention", "trace")
CSRC_GLOBS = ("batch_prefill*", "cascade.cu", "flashinfer_cascade_binding.cu")
TOOLS = ("pip", "setuptools", "wheel")  # installers, kept apart in tools/: never installed into the venv


def log(text: str) -> None:
    print(f"[gpu-kit] {text}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kwargs)


# --- downloads ------------------------------------------------------------------------------------


def pinned() -> list[str]:
    lines = (line.split("#")[0].strip() for line in PINS.read_text().splitlines())
    return [line for line in lines if line]


def download_wheels(dest: Path, python_version: str = "3.12", abi: str = "cp312") -> list[Path]:
    """The pinned wheels for CPython `python_version` on manylinux x86-64 (no sdists, no dependencies)."""
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
         python_version, "--implementation", "cp", "--abi", abi, *platforms, "-d", str(dest), *pinned()])
    return sorted(dest.glob("*.whl"))


def cached_download(spec: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    name = spec.split("=")[0].split(">")[0].replace("-", "_")
    found = sorted(dest.glob(f"{name}-*.whl"))
    if not found:
        log(f"downloading {spec}")
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(dest), spec])
        found = sorted(dest.glob(f"{name}-*.whl"))
    return found[-1]


def unpack(wheel: Path, dest: Path) -> Path:
    if not dest.exists():
        staging = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(staging)
        staging.rename(dest)
    return dest


# --- the probe: what flashinfer reads, includes and builds ------------------------------------------


def nvcc_path() -> Path | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    nvcc = Path(home) / "bin" / "nvcc"
    if nvcc.exists():
        return nvcc
    found = shutil.which("nvcc")
    return Path(found) if found else None


def preprocess_deps(command: list[str], root: Path) -> set[str]:
    """Files under `root` that one nvcc compile includes, host and device passes alike.

    nvcc's `--dryrun` lists the preprocessor runs it would make (one per pass and arch); each is rerun
    with `-M` so the dependency list comes from the exact defines each pass sees.
    """
    dry = subprocess.run([*command, "--dryrun"], capture_output=True, text=True, check=True)
    deps: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        for i, line in enumerate(dry.stderr.splitlines()):
            if not line.startswith("#$ ") or " -E " not in line:
                continue
            argv = shlex.split(line[3:])
            out = Path(tmp) / f"deps{i}.d"
            argv[argv.index("-o") + 1] = str(out)
            subprocess.run([*argv, "-M"], check=True, capture_output=True, text=True)
            names = out.read_text().replace("\\\n", " ").split()[1:]
            deps.update(str(Path(n).resolve()) for n in names if str(Path(n).resolve()).startswith(str(root)))
    return deps


def compile_argv(entry: dict) -> list[str]:
    return shlex.split(entry["command"])


def probe(out_json: Path, aot: bool, only: tuple[str, ...] = ()) -> None:
    """Run inside a Python that can import the full flashinfer: record what the kit must keep."""
    import importlib.util

    root = Path(importlib.util.find_spec("flashinfer").origin).parent.resolve()
    opened: set[str] = set()

    def audit(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.path.abspath(os.fsdecode(args[0]))
            if path.startswith(str(root)):
                opened.add(path)

    sys.addaudithook(audit)
    import flashinfer
    from flashinfer import (  # noqa: F401
        BatchPrefillWithPagedKVCacheWrapper,
        BatchPrefillWithRaggedKVCacheWrapper,
        merge_state,  # noqa: F401
    )

    sys.path.insert(0, str(HERE))
    import flashinfer_modules

    loaded = {str(Path(m.__file__).resolve()) for m in list(sys.modules.values()) if getattr(m, "__file__", None)}
    recipes = flashinfer_modules.recipes()
    specs = [flashinfer_modules.spec_of(r) for r in recipes]  # renders the sources (recorded as opened)
    deps: set[str] = set()
    modules = []
    for recipe, spec in zip(recipes, specs):
        start = time.perf_counter()
        for entry in spec.get_compile_commands():
            if entry["file"].endswith(".cu"):
                deps |= preprocess_deps(compile_argv(entry), root)
        record = {"name": spec.name, "recipe": recipe, "flashinfer": flashinfer.__version__,
                  "sources": len(spec.sources), "deps_s": round(time.perf_counter() - start, 1)}
        if aot and (not only or spec.name.startswith(only)):
            start = time.perf_counter()
            log(f"compiling {spec.name} for sm_90a (cached under {spec.build_dir})")
            spec.build(verbose=False)
            record.update(so=str(spec.jit_library_path), build_s=round(time.perf_counter() - start, 1))
        modules.append(record)
    files = sorted(p for p in opened | loaded | deps if p.startswith(str(root)))
    out_json.write_text(json.dumps({"root": str(root), "files": files, "modules": modules}, indent=1))


def run_probe(work: Path, flashinfer_tree: Path, aot: bool, curand_include: Path | None,
              cuda_stubs: Path | None, only: tuple[str, ...] = ()) -> dict:
    """Install flashinfer's CPU-side needs (cp311/this Python) next to the unpacked wheel and probe it."""
    site = work / "probe-site"
    if not (site / "tvm_ffi").exists():
        run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
             *[p for p in pinned() if p.split("==")[0] in ("apache-tvm-ffi", "nvidia-ml-py", "tabulate", "ninja")]])
    env = probe_env(work, flashinfer_tree, site, curand_include, cuda_stubs)
    nvcc = nvcc_path()
    out = work / "probe.json"
    key = hashlib.sha256("|".join([FLASHINFER, (HERE / "flashinfer_modules.py").read_text(), str(aot), ",".join(only),
                                   _nvcc_version(nvcc) if nvcc else "", str(curand_include),
                                   str(cuda_stubs)]).encode()).hexdigest()
    if out.exists():  # the probe takes minutes (nvcc preprocessing; the first prebuild much longer)
        cached = json.loads(out.read_text())
        if cached.get("key") == key and all(Path(m["so"]).exists() for m in cached["modules"] if "so" in m):
            log("reusing the probe of an identical earlier build")
            return cached
    run([sys.executable, __file__, "--probe", str(out)] + (["--aot", "on"] if aot else [])
        + (["--only", ",".join(only)] if only else []), env=env)
    probed = json.loads(out.read_text())
    out.write_text(json.dumps({**probed, "key": key}, indent=1))
    return probed


def probe_env(work: Path, flashinfer_tree: Path, site: Path, curand_include: Path | None,
              cuda_stubs: Path | None) -> dict[str, str]:
    """The probe's environment. Every path in it is absolute: nvcc runs in each module's build folder, where
    a relative ``-isystem gpukit/cuda-include`` names nothing (the FA3 prebuild then misses curand_kernel.h)."""
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join([str(flashinfer_tree.resolve()), str(site.resolve())]),
               FLASHINFER_WORKSPACE_BASE=str((work / "jit").resolve()), FLASHINFER_CUDA_ARCH_LIST="9.0a",
               PATH=os.pathsep.join([str(site.resolve() / "bin"), env.get("PATH", "")]))
    env.pop("FLASHINFER_DISABLE_JIT", None)  # the probe is where the modules get built
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    nvcc = nvcc_path()
    if nvcc is not None:
        env.setdefault("CUDA_HOME", str(nvcc.parent.parent))
    if curand_include is not None:
        env["FLASHINFER_EXTRA_CUDAFLAGS"] = f"-isystem {curand_include.resolve()}"
    if cuda_stubs is not None:
        env["FLASHINFER_EXTRA_LDFLAGS"] = f"-L{cuda_stubs.resolve()}"
    return env


# --- the trimmed flashinfer wheel -----------------------------------------------------------------


def keep(rel: str, recorded: set[str]) -> bool:
    """Whether a path of the full flashinfer package (relative to its parent folder) goes into the kit."""
    parts = rel.split("/")
    if parts[0] != "flashinfer":
        return parts[0].endswith(".dist-info")  # the wheel's other top-level files (b12x, build_*.py) stay out
    if rel in recorded:
        return True
    if parts[1] == "data":
        if parts[2] == "include":
            return True
        if parts[2] == "csrc" and len(parts) == 4:
            return any(Path(parts[3]).match(g) for g in CSRC_GLOBS)
        return False
    if not rel.endswith(".py"):
        return False
    return len(parts) == 2 or parts[1] in WHOLE_PACKAGES


def repack(tree: Path, recorded: set[str], aot: dict[str, Path], wheel: Path) -> dict:
    """Write the trimmed wheel (its RECORD regenerated) and say what went in."""
    rows, kept, dropped = [], 0, 0
    record_name = next(p for p in tree.glob("*.dist-info")).name + "/RECORD"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for path in sorted(p for p in tree.rglob("*") if p.is_file()):
            rel = path.relative_to(tree).as_posix()
            if rel == record_name or "__pycache__" in rel:
                continue
            if not keep(rel, recorded):
                dropped += 1
                continue
            kept += 1
            _add(z, rel, path.read_bytes(), rows)
        for name, so in sorted(aot.items()):
            _add(z, f"flashinfer/data/aot/{name}/{name}.so", so.read_bytes(), rows)
        rows.append(f"{record_name},,")
        z.writestr(record_name, "\n".join(rows) + "\n")
    return {"files_kept": kept, "files_dropped": dropped, "aot_modules": sorted(aot)}


def _add(z: zipfile.ZipFile, rel: str, data: bytes, rows: list[str]) -> None:
    digest = hashlib.sha256(data).digest()
    rows.append(f"{rel},sha256={base64.urlsafe_b64encode(digest).rstrip(b'=').decode()},{len(data)}")
    info = zipfile.ZipInfo(rel, date_time=(2026, 1, 1, 0, 0, 0))
    info.external_attr = (0o755 if rel.endswith(".so") else 0o644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    z.writestr(info, data, compresslevel=9)


# --- curand headers ---------------------------------------------------------------------------------


def curand_headers(work: Path, dest: Path) -> Path:
    wheel = cached_download(CURAND, work / "dl")
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if "/include/curand" in info.filename and info.filename.endswith(".h"):
                target = dest / Path(info.filename).name
                target.write_bytes(z.read(info))
                # the wheel's own time, so a rebuilt kit does not make ninja recompile the prebuilt modules
                stamp = time.mktime((*info.date_time, 0, 0, -1))
                os.utime(target, (stamp, stamp))
    return dest


def cuda_stub(dest: Path) -> Path:
    """An empty `libcuda.so` (SONAME libcuda.so.1) for flashinfer's `-lcuda` where no driver stub exists.

    Linking a shared module against a stub only records the dependency; the driver's own libcuda.so.1
    serves it at load time (CUDA ships such stubs in lib64/stubs; a pip-assembled toolkit has none).
    """
    dest.mkdir(parents=True, exist_ok=True)
    stub = dest / "libcuda.so"
    if not stub.exists():
        source = dest / "libcuda_stub.c"
        source.write_text("/* stub: the driver's libcuda.so.1 provides every symbol at load time */\n")
        run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub), str(source)])
        source.unlink()
    return dest


def toolkit_has_cuda_stub() -> bool:
    nvcc = nvcc_path()
    return nvcc is not None and (nvcc.parent.parent / "lib64" / "stubs" / "libcuda.so").exists()


def toolkit_has_curand() -> bool:
    nvcc = nvcc_path()
    return nvcc is not None and any((nvcc.parent.parent / d / "curand_kernel.h").exists()
                                    for d in ("include", "targets/x86_64-linux/include"))


# --- main ------------------------------------------------------------------------------------------


def build(out: Path, work: Path, aot_mode: str, max_mib: float, only: tuple[str, ...] = ()) -> dict:
    start = time.perf_counter()
    out, work = out.resolve(), work.resolve()  # nvcc and the probe run in other folders
    shutil.rmtree(out, ignore_errors=True)
    wheels = out / "wheels"
    log("downloading the pinned cp312 wheels")
    (out / "tools").mkdir(parents=True)
    for wheel in download_wheels(wheels):
        if wheel.name.split("-")[0] in TOOLS:
            wheel.rename(out / "tools" / wheel.name)
    curand_headers(work, out / "cuda-include")  # the GPU's JIT fallback reads the kit's copies
    # The prebuild reads copies in the work folder: nvcc's flags, and so ninja's record of each compile,
    # then name no kit folder, and a kit made elsewhere (another KIT=) reuses the compiled modules.
    curand = curand_headers(work, work / "cuda-include")
    log("unpacking flashinfer-python 0.7.4")
    tree = unpack(cached_download(FLASHINFER, work / "dl"), work / "flashinfer-full")
    nvcc = nvcc_path()
    aot = aot_mode == "on" or (aot_mode == "auto" and nvcc is not None)
    if aot and nvcc is None:
        raise SystemExit("--aot on needs nvcc (CUDA_HOME/bin/nvcc or on PATH)")
    if nvcc is None:
        raise SystemExit("building the kit needs nvcc: the header set comes from nvcc's own preprocessing")
    log(f"probing flashinfer (nvcc {nvcc}; prebuild for sm_90a: {'yes' if aot else 'no'})")
    cuda_stub(out / "cuda-stubs")
    stubs = cuda_stub(work / "cuda-stubs")
    probed = run_probe(work, tree, aot, None if toolkit_has_curand() else curand,
                       None if toolkit_has_cuda_stub() else stubs, only)
    recorded = {Path(f).relative_to(Path(probed["root"]).parent).as_posix() for f in probed["files"]}
    built = {m["name"]: Path(m["so"]) for m in probed["modules"] if "so" in m}
    fi_wheel = wheels / "flashinfer_python-0.7.4-py3-none-any.whl"
    trimmed = repack(tree, recorded, built, fi_wheel)
    nvcc_version = _nvcc_version(nvcc)
    modules = [kit_manifest.record(m["name"], m["recipe"], built[m["name"]], m["flashinfer"], nvcc_version)
               for m in probed["modules"] if m["name"] in built]
    files = sorted(p for p in out.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    manifest = {
        "flashinfer": {**trimmed, "modules": modules, "probe": probed["modules"], "sm": "90a", "nvcc": nvcc_version},
        "curand_headers_needed_here": not toolkit_has_curand(),
        "files": {p.relative_to(out).as_posix(): p.stat().st_size for p in files},
        "total_bytes": total, "total_mib": round(total / 2**20, 2), "max_mib": max_mib,
        "build_s": round(time.perf_counter() - start, 1),
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _nvcc_version(nvcc: Path) -> str:
    text = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
    return text.strip().splitlines()[-1] if text.strip() else "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "gpukit"), help="the kit folder (replaced)")
    parser.add_argument("--work", default=str(ROOT / "build" / "gpukit-work"), help="download and build cache")
    parser.add_argument("--aot", choices=("auto", "on", "off"), default="auto",
                        help="prebuild the flashinfer modules for sm_90a (auto: when nvcc is here)")
    parser.add_argument("--only", default="", help="prebuild only the modules whose names start with one of these "
                        "(comma list, e.g. cascade: a quick kit on a busy box; the kit check names the rest)")
    parser.add_argument("--max-mib", type=float, default=MAX_MIB)
    parser.add_argument("--probe", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    only = tuple(name for name in args.only.split(",") if name)
    if args.probe:
        probe(Path(args.probe), args.aot == "on", only)
        return 0
    manifest = build(Path(args.out).resolve(), Path(args.work).resolve(), args.aot, args.max_mib, only)
    for name, size in manifest["files"].items():
        print(f"{size / 2**20:8.2f} MiB  {name}")
    print(f"{manifest['total_mib']:8.2f} MiB  total (limit {args.max_mib:g} MiB); prebuilt flashinfer modules: "
          f"{', '.join(manifest['flashinfer']['aot_modules']) or 'none (source JIT on the GPU)'}")
    if manifest["total_mib"] > args.max_mib:
        print(f"error: the kit is {manifest['total_mib']} MiB, over {args.max_mib:g} MiB", file=sys.stderr)
        return 1
    files = checkout_files(untracked=True)
    if files is not None:
        checkout = sum(files.values()) / 2**20
        print(f"{checkout + manifest['total_mib']:8.2f} MiB  with the checkout's files ({checkout:.2f} MiB: tracked, "
              "and untracked ones git does not ignore); "
              f"at most {TRAVEL_MIB} MiB travels to the GPU machine")
        problem = travel_problem(manifest["total_mib"], files)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 1
    return 0


def checkout_files(untracked: bool = False) -> dict[str, int] | None:
    """Bytes of each file git tracks here (they travel with the kit), with ``untracked`` also of the untracked
    files git does not ignore (they travel too), or None outside a git checkout."""
    others = ["--others", "--exclude-standard"] if untracked else []
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", *others], cwd=ROOT, capture_output=True)
    if listed.returncode:
        return None
    names = [n for n in listed.stdout.decode().split("\0") if n]
    return {n: (ROOT / n).stat().st_size for n in names if (ROOT / n).is_file()}


def travel_problem(kit_mib: float, files: dict[str, int]) -> str | None:
    """Why the kit and the checkout's ``files`` cannot travel together to the GPU machine (`run` carries at most
    `TRAVEL_MIB` of both), naming the largest files; None when they fit."""
    checkout = sum(files.values()) / 2**20
    if checkout + kit_mib <= TRAVEL_MIB:
        return None
    largest = sorted(files.items(), key=lambda item: -item[1])[:5]
    names = ", ".join(f"{name} ({size / 2**20:.2f} MiB)" for name, size in largest)
    return (f"the kit ({kit_mib:.2f} MiB) and the checkout's files ({checkout:.2f} MiB) are {checkout + kit_mib:.2f} "
            f"MiB, over the {TRAVEL_MIB} MiB that travels to the GPU machine; the largest files: {names}")


if __name__ == "__main__":
    sys.exit(main())
