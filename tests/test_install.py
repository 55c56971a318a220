"""The Makefile's install logic, run with a stand-in python that records what it is asked to do.

`make demo` installs the core only; `make test` what the tests import. torch comes first: without an NVIDIA
driver from PyTorch's CPU wheel index, falling back to the plain pin when that index cannot be reached.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")
FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$FAKE_LOG"
case "$*" in
  -c*) exit "${PROBE_RC:-0}" ;;
  *--index-url*) exit "${INDEX_RC:-0}" ;;
esac
exit 0
"""

pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed")


def run_torch_install(tmp_path: Path, *, driver: bool, probe_rc: int = 0, index_rc: int = 0) -> list[str]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    tools = tmp_path / "tools"  # a PATH with touch (and nvidia-smi when a driver is emulated), nothing else
    tools.mkdir()
    (tools / "touch").symlink_to(shutil.which("touch"))
    if driver:
        (tools / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
        (tools / "nvidia-smi").chmod(0o755)
    log = tmp_path / "log"
    env = {"PATH": str(tools), "FAKE_LOG": str(log), "PROBE_RC": str(probe_rc), "INDEX_RC": str(index_rc),
           "HOME": os.environ.get("HOME", "/tmp")}
    proc = subprocess.run([MAKE, "-C", str(ROOT), f"VENV={venv}", f"{venv}/.torch"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (venv / ".torch").is_file()
    return log.read_text().splitlines()


CPU_INDEX = "-m pip install -q --index-url https://download.pytorch.org/whl/cpu torch==2.13.0"
PLAIN = "-m pip install -q torch==2.13.0"


def test_no_driver_takes_the_cpu_index(tmp_path):
    calls = run_torch_install(tmp_path, driver=False)
    assert calls[0].startswith("-c import urllib.request") and calls[1:] == [CPU_INDEX]


def test_no_driver_and_no_cpu_index_falls_back_to_the_plain_pin(tmp_path):
    assert run_torch_install(tmp_path, driver=False, probe_rc=1)[1:] == [PLAIN]
    assert run_torch_install(tmp_path / "b", driver=False, index_rc=1)[1:] == [CPU_INDEX, PLAIN]


def test_a_driver_takes_the_default_build(tmp_path):
    assert run_torch_install(tmp_path, driver=True) == [PLAIN]


def test_demo_installs_the_core_and_test_the_extras(tmp_path):
    def planned(target: str) -> str:
        proc = subprocess.run([MAKE, "-n", "-C", str(ROOT), f"VENV={tmp_path / 'v'}", target], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    demo, test = planned("demo"), planned("test")
    assert "pip install -q -e .\n" in demo and "[dev" not in demo and "worldstep rollout" in demo
    assert 'pip install -q -e ".[dev,dist,remote,lerobot,view]"' in test and "pytest" in test


def test_dev_extra_pins_the_rl_clients():
    from importlib.metadata import requires

    dev = [r.split(";")[0].strip() for r in requires("worldstep") if 'extra == "dev"' in r]
    pins = {d.split("==")[0] for d in dev if "==" in d}
    assert pins >= {"torchrl", "stable-baselines3"}
    assert not any(d.startswith("torch") and not d.startswith("torchrl") for d in dev)  # never another torch


def test_package_ships_license_and_py_typed():
    from importlib.resources import files

    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert files("worldstep").joinpath("py.typed").is_file()
