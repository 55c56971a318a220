"""The GPU kit and the GPU run's own logic, on the CPU: what can go wrong before a GPU is reached.

- `make gpu-kit` with a relative `--out` gave nvcc (run in each module's build folder) a relative
  `-isystem gpukit/cuda-include`, and the FA3 prebuild missed curand_kernel.h: every path is absolute now.
- The kit's MANIFEST records each prebuilt module (name, generator and arguments, flashinfer and nvcc
  versions, sha256) and the dry run checks that record against what `flashinfer_modules` asks for.
- Each prebuilt module is loaded in a fresh process with `ldd -r` clean; without a driver the kit's stub
  stands in as libcuda.so.1 (here, a module built by `cc` against that stub).
- `run_gpu_checks.sh` rewrites summary.json after every step, so a step killed by its limit (or a run cut
  short) still returns what finished.
- The kit travels to the GPU machine with the checkout's tracked files, at most 64 MiB of both: the checkout
  keeps within its share, and `make gpu-kit` fails, naming the largest files, when the two do not fit.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

GPU = Path(__file__).parent / "gpu"
sys.path.insert(0, str(GPU))
import build_kit  # noqa: E402
import flashinfer_modules  # noqa: E402
import kit_manifest  # noqa: E402
import prebuilt  # noqa: E402

HAS_CC = subprocess.run(["sh", "-c", "command -v cc && command -v ldd"], capture_output=True).returncode == 0


# --- what travels -------------------------------------------------------------------------------------


def test_the_checkout_leaves_room_for_the_kit():
    """A run's resume state committed here once pushed the checkout to 48 MiB, and kit plus checkout over the
    64 MiB a GPU run may carry: the GPU check could not have started."""
    tracked = build_kit.checkout_files()
    if tracked is None:
        pytest.skip("not a git checkout (a source tarball): nothing here travels to a GPU machine")
    checkout_mib = sum(tracked.values()) / 2**20
    assert checkout_mib <= build_kit.CHECKOUT_MAX_MIB, sorted(tracked.items(), key=lambda item: -item[1])[:5]


def test_a_kit_and_checkout_over_the_limit_are_refused_naming_the_largest_files():
    tracked = {"runs/a/dyn_state.pt": 40 * 2**20, "README.md": 10_000, "docs/x.png": 2**20}
    problem = build_kit.travel_problem(29.0, tracked)
    assert "over the 64 MiB" in problem and problem.index("dyn_state.pt (40.00 MiB)") < problem.index("docs/x.png")
    assert build_kit.travel_problem(29.0, {"README.md": 10_000}) is None


# --- absolute paths -----------------------------------------------------------------------------------


def test_the_probe_hands_nvcc_absolute_include_and_library_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLASHINFER_DISABLE_JIT", "1")  # the GPU run's setting must not stop the prebuild
    env = build_kit.probe_env(Path("build/work"), Path("build/work/fi"), Path("build/work/site"),
                              Path("gpukit/cuda-include"), Path("gpukit/cuda-stubs"))
    assert env["FLASHINFER_EXTRA_CUDAFLAGS"] == f"-isystem {tmp_path / 'gpukit' / 'cuda-include'}"
    assert env["FLASHINFER_EXTRA_LDFLAGS"] == f"-L{tmp_path / 'gpukit' / 'cuda-stubs'}"
    assert env["FLASHINFER_WORKSPACE_BASE"] == str(tmp_path / "build" / "work" / "jit")
    assert all(Path(p).is_absolute() for p in env["PYTHONPATH"].split(os.pathsep))
    assert "FLASHINFER_DISABLE_JIT" not in env


def test_build_gets_absolute_folders_from_a_relative_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    seen = {}

    def fake_build(out, work, aot, max_mib, only):
        seen.update(out=out, work=work)
        return {"files": {}, "total_mib": 0.0, "flashinfer": {"aot_modules": []}}

    monkeypatch.setattr(build_kit, "build", fake_build)
    assert build_kit.main(["--out", "gpukit", "--work", "build/w"]) == 0
    assert seen == {"out": tmp_path / "gpukit", "work": tmp_path / "build" / "w"}


# --- the MANIFEST's records against what is asked -------------------------------------------------------


def _kit(tmp_path) -> tuple[list[dict], list[dict], dict[str, Path]]:
    """Two fake prebuilt modules, their records and what a checkout would ask for."""
    expected, records, installed = [], [], {}
    for name, recipe in (("prefill", {"generator": "flashinfer.jit.a.gen_prefill", "args": ["fa3", "bfloat16", 128]}),
                         ("cascade", {"generator": "flashinfer.jit.cascade.gen_cascade_module", "args": []})):
        so = tmp_path / "site" / "flashinfer" / "data" / "aot" / name / f"{name}.so"
        so.parent.mkdir(parents=True)
        so.write_bytes(name.encode() * 100)
        records.append(kit_manifest.record(name, recipe, so, "0.7.4", "Cuda compilation tools, release 13.0"))
        expected.append({"name": name, **recipe, "flashinfer": "0.7.4"})
        installed[name] = tmp_path / "site" / records[-1]["path"]
    return records, expected, installed


def test_manifest_records_that_match_what_is_asked_pass(tmp_path):
    records, expected, installed = _kit(tmp_path)
    assert installed["prefill"].exists()  # the record's path is where the installed flashinfer keeps it
    assert records[0]["sha256"] == kit_manifest.sha256(installed["prefill"]) and records[0]["bytes"] == 700
    assert kit_manifest.check(records, expected, installed) == []
    assert json.loads(json.dumps(records)) == records  # MANIFEST.json holds them as they are


@pytest.mark.parametrize("fault, says", [
    (lambda r, e, i: r[0].update(args=["fa2", "bfloat16", 128]), "args=['fa2', 'bfloat16', 128]"),
    (lambda r, e, i: r[0].update(generator="flashinfer.jit.b.gen_other"), "generator="),
    (lambda r, e, i: r[1].update(flashinfer="0.7.3"), "flashinfer='0.7.3'"),
    (lambda r, e, i: r[1].update(nvcc=""), "which nvcc"),
    (lambda r, e, i: r.pop(0), "prefill (flashinfer.jit.a.gen_prefill('fa3', 'bfloat16', 128)) is not in"),
    (lambda r, e, i: e.pop(1), "cascade is in the kit but nothing asks for it"),
    (lambda r, e, i: i["cascade"].write_bytes(b"other"), "sha256 mismatch"),
    (lambda r, e, i: i["cascade"].unlink(), "has no flashinfer/data/aot/cascade/cascade.so"),
])
def test_manifest_records_that_differ_from_what_is_asked_are_named(tmp_path, fault, says):
    records, expected, installed = _kit(tmp_path)
    fault(records, expected, installed)
    problems = kit_manifest.check(records, expected, installed)
    assert len(problems) == 1 and says in problems[0], problems


def test_recipes_are_json_and_make_their_specs_with_torch_dtypes(monkeypatch):
    assert json.loads(json.dumps(flashinfer_modules.recipes())) == flashinfer_modules.recipes()
    assert [r["generator"].rsplit(".", 1)[1] for r in flashinfer_modules.recipes()] == [
        "gen_batch_prefill_module", "gen_cascade_module"]
    fake = types.ModuleType("fake_flashinfer_jit")
    fake.gen = lambda *args: args
    monkeypatch.setitem(sys.modules, "fake_flashinfer_jit", fake)
    made = flashinfer_modules.spec_of({"generator": "fake_flashinfer_jit.gen", "args": ["fa3", "bfloat16", "int32",
                                                                                        128, False]})
    assert made == ("fa3", torch.bfloat16, torch.int32, 128, False)


# --- loading a prebuilt module: ldd -r and a fresh process, the stub as libcuda.so.1 -----------------------

CTYPES_LOAD = "import ctypes, sys; ctypes.CDLL(sys.argv[1])"


def _module(tmp_path, source: str, stubs: Path) -> Path:
    """A shared module built by cc that needs libcuda.so.1 (linked against the kit's stub, as flashinfer's)."""
    src, so = tmp_path / "mod.c", tmp_path / "mod.so"
    src.write_text(source)
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,--no-as-needed", "-o", str(so), str(src), f"-L{stubs}", "-lcuda"],
                   check=True)
    return so


@pytest.mark.skipif(not HAS_CC, reason="needs cc and ldd")
def test_a_module_loads_with_the_stub_as_libcuda_and_not_without(tmp_path):
    stubs = build_kit.cuda_stub(tmp_path / "cuda-stubs")
    so = _module(tmp_path, "int answer(void) { return 42; }\n", stubs)
    without = prebuilt.check(so, prebuilt.load_env([]), load=CTYPES_LOAD)
    assert not without["ok"] and any("libcuda.so.1 => not found" in p for p in without["ldd_problems"])
    assert not without["loaded"] and "libcuda.so.1" in without["load_error"]
    stub_dir = prebuilt.stub_as_libcuda(stubs, tmp_path / "stub")
    assert os.path.realpath(stub_dir / "libcuda.so.1") == str((stubs / "libcuda.so").resolve())
    env = prebuilt.load_env(prebuilt.library_dirs(stub_dir))
    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[0] == str(stub_dir)
    assert prebuilt.check(so, env, load=CTYPES_LOAD) == {"so": str(so), "ldd_problems": [], "loaded": True,
                                                          "load_error": None, "ok": True}


@pytest.mark.skipif(not HAS_CC, reason="needs cc and ldd")
def test_a_module_with_an_unresolved_symbol_fails_ldd(tmp_path):
    stubs = build_kit.cuda_stub(tmp_path / "cuda-stubs")
    so = _module(tmp_path, "int cuMissing(void);\nint answer(void) { return cuMissing(); }\n", stubs)
    result = prebuilt.check(so, prebuilt.load_env([str(prebuilt.stub_as_libcuda(stubs, tmp_path / "stub"))]),
                            load=CTYPES_LOAD)
    assert not result["ok"] and any("undefined symbol: cuMissing" in p for p in result["ldd_problems"])


@pytest.mark.skipif(not HAS_CC, reason="needs cc and ldd")
def test_the_kit_check_compares_the_records_then_loads_each_module_with_the_stub(tmp_path, monkeypatch):
    import check_kit

    kit, site = tmp_path / "kit", tmp_path / "site"
    stubs = build_kit.cuda_stub(kit / "cuda-stubs")
    so = site / "flashinfer" / "data" / "aot" / "mod" / "mod.so"
    so.parent.mkdir(parents=True)
    so.write_bytes(_module(tmp_path, "int answer(void) { return 42; }\n", stubs).read_bytes())
    recipe = {"generator": "flashinfer.jit.x.gen_mod", "args": ["fa3", 128]}
    record = kit_manifest.record("mod", recipe, so, "0.7.4", "Cuda compilation tools, release 13.0")
    (kit / "MANIFEST.json").write_text(json.dumps({"flashinfer": {"modules": [record]}}))
    fake = types.ModuleType("flashinfer")
    fake.__file__ = str(site / "flashinfer" / "__init__.py")
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    monkeypatch.setattr(flashinfer_modules, "expected", lambda: [{"name": "mod", **recipe, "flashinfer": "0.7.4"}])
    monkeypatch.setattr(prebuilt, "check", functools.partial(prebuilt.check, load=CTYPES_LOAD))  # no tvm_ffi here
    monkeypatch.setenv("GPU_KIT", str(kit))
    doc = check_kit.prebuilt(torch.device("cpu"))  # the dry run: the stub serves as libcuda.so.1
    assert doc["problems"] == [] and doc["stub_libcuda"] is True and doc["ok"] is True
    assert [(load["name"], load["loaded"], load["ldd_problems"]) for load in doc["loads"]] == [("mod", True, [])]
    without_stub = check_kit.prebuilt(torch.device("cuda"))  # as on a GPU machine, here without a driver
    assert without_stub["ok"] is False and not without_stub["loads"][0]["loaded"]
    monkeypatch.setattr(flashinfer_modules, "expected", lambda: [{"name": "mod", **recipe, "flashinfer": "0.7.5"}])
    assert check_kit.prebuilt(torch.device("cpu"))["problems"] == [
        "module mod: the kit has flashinfer='0.7.4', this checkout asks for '0.7.5'"]


@pytest.mark.skipif(not HAS_CC, reason="needs cc and ldd")
def test_ldd_sees_the_symbols_the_loading_process_provides(tmp_path):
    """flashinfer's modules call TVMFFI* from the already-loaded libtvm_ffi.so, which they do not name."""
    host_src, host = tmp_path / "host.c", tmp_path / "libhost.so"
    host_src.write_text("int TVMFFIErrorSetRaised(void) { return 1; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(host), str(host_src)], check=True)
    stubs = build_kit.cuda_stub(tmp_path / "cuda-stubs")
    so = _module(tmp_path, "int TVMFFIErrorSetRaised(void);\nint answer(void) { return TVMFFIErrorSetRaised(); }\n",
                 stubs)
    env = prebuilt.load_env([str(prebuilt.stub_as_libcuda(stubs, tmp_path / "stub"))])
    alone = prebuilt.check(so, env, load=CTYPES_LOAD, preload=[])
    assert any("undefined symbol: TVMFFIErrorSetRaised" in p for p in alone["ldd_problems"])
    assert prebuilt.check(so, env, load=CTYPES_LOAD, preload=[str(host)])["ldd_problems"] == []


def test_ldd_problem_lines():
    text = ("\tlinux-vdso.so.1 (0x00007ffd)\n\tlibcudart.so.13 => not found\n"
            "undefined symbol: TVMFFIErrorSetRaised\t(./m.so)\n\tlibc.so.6 => /lib/libc.so.6 (0x7f)\n")
    assert prebuilt.ldd_problems(text) == ["libcudart.so.13 => not found",
                                           "undefined symbol: TVMFFIErrorSetRaised\t(./m.so)"]


# --- summary.json after every step -----------------------------------------------------------------------


def _steps(tmp_path, script: str, budget: int = 100) -> subprocess.CompletedProcess:
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OUT": str(out), "BUDGET": str(budget), "T0": str(int(time.time())),
           "BASE_PY": sys.executable, "DEVICE": "cpu"}
    return subprocess.run(["bash", "-c", f"set -uo pipefail; source {GPU / 'steps.sh'}; {script}"], env=env,
                          capture_output=True, text=True, timeout=120)


ATTENTION = json.dumps({"ok": True, "worst": {"flashinfer_vs_sdpa": 0.004}, "bound": 0.016, "flashinfer": "ran"})


def test_summary_is_written_after_every_step_and_keeps_a_timed_out_steps_predecessors(tmp_path):
    out = tmp_path / "out"
    (tmp_path / "attention.src").write_text(ATTENTION)
    run = _steps(tmp_path, f"""
step attention 30 cp {tmp_path / 'attention.src'} {out / 'attention.json'}
step slow 1 bash -c 'cp $OUT/summary.json $OUT/after_first.json; sleep 30'
echo "status $STATUS last $LAST_RC"
""")
    assert run.returncode == 0, run.stderr
    assert "status 1 last 124" in run.stdout  # the slow step was killed at its limit and failed the run
    after_first = json.loads((out / "after_first.json").read_text())  # written before the second step began
    assert [s["step"] for s in after_first["steps"]] == ["attention"] and after_first["finished"] is False
    assert after_first["headline"]["parity"]["worst"] == {"flashinfer_vs_sdpa": 0.004}
    summary = json.loads((out / "summary.json").read_text())
    assert [(s["step"], s["rc"], s["timed_out"]) for s in summary["steps"]] == [("attention", 0, False),
                                                                               ("slow", 124, True)]
    assert summary["ok"] is False and summary["finished"] is False
    assert summary["headline"]["parity"]["ok"] is True and summary["headline"]["bench"] is None


def test_a_step_past_the_budget_is_skipped_and_the_final_summary_says_so(tmp_path):
    run = _steps(tmp_path, "step late 30 true; summarize --final", budget=10)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["steps"][0]["step"] == "late" and summary["steps"][0]["skipped"] is True
    assert summary["finished"] is True and summary["ok"] is False and "FAILED" in run.stdout


def test_the_headline_reads_a_partial_bench_and_never_writes_nan(tmp_path):
    import summary

    out = tmp_path / "out"
    out.mkdir()
    bench = {"results": {"attention_backend": "flashinfer", "section_s": {"windows": 12.0},
                         "runs": [{"num_steps": 4, "cfg": False, "context_tokens": 3546, "timed_windows": 5,
                                   "ms_per_window": 80.0, "mfu": float("nan"), "real_time_factor": 8.3}]}}
    (out / summary.HEADLINE_BENCH).write_text(json.dumps(bench))
    (out / "attention.json").write_text('{"ok": tr')  # cut mid-write by a timeout
    doc = summary.summarize(out, "cuda", 42, 0, final=False)
    summary.write(out, doc)
    written = json.loads((out / "summary.json").read_text())
    assert written["headline"]["parity"] is None and written["headline"]["bench"]["sections_done"] == ["windows"]
    assert written["headline"]["bench"]["windows"][0]["mfu"] is None  # NaN is not JSON
    assert written["headline"]["bench"]["windows"][0]["timed_windows"] == 5
