"""Load each prebuilt flashinfer module as the GPU run will: `ldd -r` clean, then `tvm_ffi.load_module`.

A flashinfer module calls tvm-ffi's C API (TVMFFI*) without listing libtvm_ffi.so as NEEDED: the process
that loads it has tvm-ffi loaded already. `ldd -r` sees the same with that library as LD_PRELOAD; any
other unresolved symbol or missing library fails the check.

flashinfer loads ``data/aot/<name>/<name>.so`` without an architecture check, and when that load fails it
falls back to compiling, which takes the GPU run's whole budget (the run sets ``FLASHINFER_DISABLE_JIT=1``
so that fallback is an error in seconds). Here each module is loaded in a fresh process, with the library
folders the GPU run sees: CUDA's ``lib64``, the nvidia wheels' and torch's libraries, tvm-ffi's. On a
machine with no NVIDIA driver (the dry run) the kit's empty stub stands in as ``libcuda.so.1``: the load
then proves every other dependency and symbol resolves; only the driver's own entry points stay unchecked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LOAD = "import sys, tvm_ffi; tvm_ffi.load_module(sys.argv[1]); print('loaded', sys.argv[1])"


def stub_as_libcuda(stubs: Path, dest: Path) -> Path:
    """A folder holding the kit's stub under the driver's file name, ``libcuda.so.1`` (its SONAME)."""
    dest.mkdir(parents=True, exist_ok=True)
    link = dest / "libcuda.so.1"
    if not link.exists():
        link.symlink_to((stubs / "libcuda.so").resolve())
    return dest


def library_dirs(stub_dir: Path | None = None) -> list[str]:
    """Folders that hold the modules' NEEDED libraries on this machine, the stub's first when given."""
    dirs = [stub_dir] if stub_dir is not None else []
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    dirs += [home / "lib64", home / "targets" / "x86_64-linux" / "lib"]
    for entry in map(Path, sys.path):
        dirs += [entry / "torch" / "lib", entry / "tvm_ffi" / "lib", *sorted(entry.glob("nvidia/*/lib"))]
    return [str(d) for d in dict.fromkeys(dirs) if d.is_dir()]


def host_libraries() -> list[str]:
    """The libraries the loading process holds before it loads a module: tvm-ffi's, which every flashinfer
    module calls (TVMFFI*) without naming it as NEEDED. `ldd -r` gets them as LD_PRELOAD, as the load does."""
    found = (sorted(Path(entry).glob("tvm_ffi/lib/libtvm_ffi.so")) for entry in sys.path)
    return [str(p) for p in dict.fromkeys(p for paths in found for p in paths)][:1]


def load_env(dirs: list[str]) -> dict[str, str]:
    """This process's environment with `dirs` in front of LD_LIBRARY_PATH."""
    old = os.environ.get("LD_LIBRARY_PATH", "")
    return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join([*dirs, *([old] if old else [])])}


def ldd_problems(text: str) -> list[str]:
    """The lines of `ldd -r` output that name a missing library or an unresolved symbol."""
    return [line.strip() for line in text.splitlines()
            if "not found" in line or "undefined symbol" in line or "not a dynamic executable" in line]


def check(so: Path, env: dict[str, str], timeout_s: float = 60, load: str = LOAD,
          preload: list[str] | None = None) -> dict:
    """`ldd -r` and a load in a fresh process; ``ok`` only when ldd is clean and the load succeeded.

    ``load``: the Python the fresh process runs with the module's path as ``sys.argv[1]``; ``preload``:
    what that process holds already (default `host_libraries()`), preloaded for `ldd -r`.
    """
    preload = host_libraries() if preload is None else preload
    ldd_env = {**env, "LD_PRELOAD": " ".join(preload)} if preload else env
    ldd = subprocess.run(["ldd", "-r", str(so)], capture_output=True, text=True, env=ldd_env, timeout=timeout_s)
    problems = ldd_problems(ldd.stdout + ldd.stderr)
    if ldd.returncode and not problems:
        problems = [f"ldd -r exited {ldd.returncode}: {ldd.stderr.strip()[-300:]}"]
    loaded = subprocess.run([sys.executable, "-c", load, str(so)], capture_output=True, text=True, env=env,
                            timeout=timeout_s)
    error = None if loaded.returncode == 0 else (loaded.stderr.strip() or loaded.stdout.strip())[-1500:]
    return {"so": str(so), "ldd_problems": problems, "loaded": loaded.returncode == 0, "load_error": error,
            "ok": not problems and loaded.returncode == 0}
