"""The kit's record of each prebuilt flashinfer module, and the check of that record against what is asked.

`build_kit.py` writes one record per module it compiled into MANIFEST.json (``flashinfer.modules``): the
module's name, the flashinfer generator and arguments that made it (`flashinfer_modules.RECIPES`), the
flashinfer version, nvcc's version, and the .so's size and sha256. `check_kit.py` compares those records
with what `flashinfer_modules.expected()` asks for in the installed flashinfer, and the installed .so
files with their recorded sha256: a kit built from other arguments, another flashinfer or a damaged
wheel is named before anything loads it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

AOT_PATH = "flashinfer/data/aot/{name}/{name}.so"  # inside the flashinfer wheel (and its install)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record(name: str, recipe: dict, so: Path, flashinfer_version: str, nvcc_version: str) -> dict:
    """One prebuilt module, as MANIFEST.json keeps it."""
    return {"name": name, "generator": recipe["generator"], "args": list(recipe["args"]),
            "flashinfer": flashinfer_version, "nvcc": nvcc_version, "path": AOT_PATH.format(name=name),
            "bytes": so.stat().st_size, "sha256": sha256(so)}


def check(records: list[dict], expected: list[dict], installed: dict[str, Path | None]) -> list[str]:
    """What is wrong with the kit's records, one sentence each (empty: the kit is what is asked).

    ``expected``: `flashinfer_modules.expected()` (name, generator, args, flashinfer per module);
    ``installed``: module name -> the .so the installed flashinfer would load (None when absent).
    """
    problems = []
    by_name = {r["name"]: r for r in records}
    for want in expected:
        have = by_name.get(want["name"])
        if have is None:
            problems.append(f"module {want['name']} ({want['generator']}{tuple(want['args'])}) is not in the "
                            "kit's MANIFEST: rebuild the kit (make gpu-kit)")
            continue
        for field in ("generator", "args", "flashinfer"):
            if have.get(field) != want[field]:
                problems.append(f"module {want['name']}: the kit has {field}={have.get(field)!r}, this "
                                f"checkout asks for {want[field]!r}")
        if not have.get("nvcc"):
            problems.append(f"module {want['name']}: the MANIFEST does not say which nvcc built it")
        so = installed.get(want["name"])
        if so is None or not Path(so).exists():
            problems.append(f"module {want['name']}: the installed flashinfer has no {have.get('path')}")
        elif sha256(Path(so)) != have.get("sha256"):
            problems.append(f"module {want['name']}: {so} differs from the kit's (sha256 mismatch)")
    for name in sorted(set(by_name) - {w["name"] for w in expected}):
        problems.append(f"module {name} is in the kit but nothing asks for it (flashinfer_modules.RECIPES)")
    return problems
