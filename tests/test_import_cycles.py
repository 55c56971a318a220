"""Training, planning, policies and the fidelity report import each other's modules at the top, in any order.

``worldstep.fidelity``'s ``__init__`` imports nothing: were it to re-export ``report.main``, importing a fidelity
leaf (``policies``, ``metrics``, ``seeds``) would load the report, which imports ``train.data`` and ``planning``,
which import those leaves: a cycle the module graph of ``test_structure.py`` cannot show (a submodule has no edge
to its package), and the reason these imports once sat inside functions. Each module is imported first in a
fresh interpreter; the last test puts the re-export back and sees the cycle.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

FIRST = ("worldstep.train.data", "worldstep.train", "worldstep.planning", "worldstep.truth", "worldstep.policies",
         "worldstep.envs.push_policies", "worldstep.fidelity.openloop", "worldstep.fidelity.records",
         "worldstep.fidelity.tasks", "worldstep.fidelity.report")

REEXPORT = """
import importlib.abc, importlib.util, sys

class ReExportReport(importlib.abc.MetaPathFinder):
    '''Loads worldstep.fidelity with `from .report import main` at the end of its __init__, as it once was.'''

    def find_spec(self, name, path, target=None):
        if name != "worldstep.fidelity":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            exec("from .report import main", module.__dict__)

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, ReExportReport())
"""


def _import(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("module", FIRST)
def test_each_module_imports_first(module):
    done = _import(f"import {module}")
    assert done.returncode == 0, done.stderr


def test_a_fidelity_init_that_loads_the_report_is_a_cycle():
    done = _import(REEXPORT + "import worldstep.planning\n")  # planning -> fidelity.metrics -> report -> planning
    assert done.returncode != 0 and "partially initialized module 'worldstep.planning'" in done.stderr, done.stderr
    assert _import(REEXPORT + "import worldstep.fidelity.report\n").returncode == 0  # the hook itself works
