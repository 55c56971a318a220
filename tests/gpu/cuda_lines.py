"""The lines of the GPU-facing modules a focused CPU run never executes, and the one list that accounts for them.

The GPU-facing modules are found, not named: every module under ``engine/`` that mentions ``cuda`` or
``flashinfer``, and ``sdk/bench/gpu*.py`` (what `bench gpu` runs). `SUBSET` (the CPU tests of those modules,
CUDA emulated where it can be: flashinfer by tests/flashinfer_emulation.py, graph capture and CUDA streams
mocked) runs under coverage.py; each line it never executes must be named in `cuda_only_lines.txt`, next to
where it runs instead (a ``gpu:`` check of run_gpu_checks.sh, or ``cpu:`` for a CPU path outside the subset).
A line is keyed by its file, the qualified name of the function (or class) it is in and its stripped text,
never its number, so an edit elsewhere in the file moves no entry. `unaccounted` gives the lines the list
lacks and the entries no longer needed.

    python tests/gpu/cuda_lines.py            # measure, and print the entries the list lacks or no longer needs
    python tests/gpu/cuda_lines.py --write    # rewrite the list (keeps the ``where`` of every entry it had)
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIST = Path(__file__).with_name("cuda_only_lines.txt")
SUBSET = ("tests/test_indexed_device.py", "tests/test_attention.py", "tests/test_gpu_regime.py",
          "tests/test_stream_handover.py", "tests/test_kv_cache.py", "tests/test_bench_gpu_figures.py",
          "tests/test_bench_gpu_ab.py",
          "tests/test_bench.py::test_gpu_sessions_official_backends_on_cpu",
          "tests/test_context_noise.py::test_off_is_the_clean_commit_bit_for_bit_and_a_level_changes_only_later_windows")
GPU_WORDS = re.compile(r"\bcuda\b|flashinfer|torch\.cuda")
SEP = " | "

Key = tuple[str, str, str]  # (file relative to the root, qualified function name, stripped source)


def gpu_facing(root: Path = ROOT) -> list[Path]:
    """The modules this accounting covers (module docstring)."""
    engine = [p for p in sorted((root / "engine").rglob("*.py")) if GPU_WORDS.search(p.read_text())]
    return engine + sorted((root / "sdk" / "bench").glob("gpu*.py"))


def qualnames(source: str) -> dict[int, str]:
    """Line number -> qualified name of the innermost function or class around it ("<module>" outside any)."""
    names: dict[int, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}.{child.name}" if prefix else child.name
                for line in range(child.lineno, (child.end_lineno or child.lineno) + 1):
                    names[line] = name
                visit(child, name)
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return names


def keys_of(path: Path, lines: set[int], root: Path = ROOT) -> Counter[Key]:
    source = path.read_text()
    text, names = source.splitlines(), qualnames(source)
    rel = str(path.relative_to(root))
    return Counter((rel, names.get(n, "<module>"), text[n - 1].strip()) for n in sorted(lines))


def read_list(path: Path = LIST) -> dict[Key, list[str]]:
    """Entries ``file | function | source | where`` (``#`` comments); a key listed twice counts twice."""
    entries: dict[Key, list[str]] = {}
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        file, function, rest = raw.split(SEP, 2)
        source, where = rest.rsplit(SEP, 1)
        entries.setdefault((file, function, source), []).append(where)
    return entries


def unaccounted(uncovered: Counter[Key], listed: dict[Key, list[str]]) -> tuple[list[Key], list[Key]]:
    """(uncovered lines the list lacks, listed lines no longer uncovered), each key repeated per missing count."""
    have = Counter({key: len(wheres) for key, wheres in listed.items()})
    return sorted((uncovered - have).elements()), sorted((have - uncovered).elements())


def measure(data_file: Path, root: Path = ROOT, python: str = sys.executable) -> Counter[Key]:
    """Run `SUBSET` under coverage (a subprocess, one thread) and key every line of `gpu_facing` it never ran."""
    import coverage

    files = gpu_facing(root)
    include = ",".join(str(p) for p in files)
    run = subprocess.run([python, "-m", "coverage", "run", f"--data-file={data_file}", f"--include={include}",
                          "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *SUBSET], cwd=root,
                         capture_output=True, text=True, env=_env())
    if run.returncode != 0:
        raise RuntimeError(f"the coverage subset failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    cov = coverage.Coverage(data_file=str(data_file))
    cov.load()
    out: Counter[Key] = Counter()
    for path in files:
        _, _, _, missing, _ = cov.analysis2(str(path))
        out += keys_of(path, set(missing), root)
    return out


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1"}


def write_list(uncovered: Counter[Key], old: dict[Key, list[str]], path: Path = LIST) -> None:
    header = [line for line in path.read_text().splitlines() if line.startswith("#")] if path.exists() else []
    lines = []
    for key in sorted(uncovered):
        wheres = old.get(key, [])
        for i in range(uncovered[key]):
            lines.append(SEP.join([*key, wheres[i] if i < len(wheres) else "TODO: where it runs"]))
    path.write_text("\n".join(header + lines) + "\n")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        found = measure(Path(tmp) / "coverage.data")
    listed = read_list() if LIST.exists() else {}
    if "--write" in sys.argv[1:]:
        write_list(found, listed)
        listed = read_list()
    missing, stale = unaccounted(found, listed)
    for key in missing:
        print("unlisted:", SEP.join(key))
    for key in stale:
        print("no longer uncovered:", SEP.join(key))
    sys.exit(1 if missing or stale else 0)
