"""The product apart from its research, and no cycle between the top-level parts of ``worldstep``.

Research is the pusher's training and the studies built on the product; everything else in ``worldstep`` is the
product, and no product module imports research. The parts (``worldstep.X``: ``planning``, ``envs``,
``fidelity``, ...) import each other one way: no two reach each other, directly or round a loop. Imports inside
functions count (``part_rules``). Both rules are run on a synthetic package and on a copy of this tree with one
import injected, and fail there.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from part_rules import module_graph, part_cycles, part_graph, product_to_research, unresolved_imports
from structure_rules import Tree

ROOT = Path(__file__).parent.parent
PACKAGES = {"sdk": "worldstep", "envs": "worldstep.envs", "engine": "worldstep.engine"}

# The one definition of research: the pusher's training and the studies. Everything else is the product.
RESEARCH = ("worldstep.fidelity", "worldstep.train", "worldstep.bench")
# The `worldstep` command lists every subcommand, the studies' (`bench`, `train`, `fidelity`, `export-pushsim`)
# too: its dispatcher is the one product module that names research, and it only hands them the command line.
DISPATCHER = frozenset({"worldstep.cli.command"})


def _rules(root: Path, packages: dict[str, str], top: str, research, allowed=frozenset()):
    g = module_graph(Tree(root, packages), top)
    parts = part_graph(g, top)
    return part_cycles(parts), product_to_research(g, research, allowed), parts


def test_no_part_cycle_and_no_product_to_research_import():
    found_cycles, upward, parts = _rules(ROOT, PACKAGES, "worldstep", RESEARCH, DISPATCHER)
    assert not found_cycles, {p: {q: parts[p][q] for q in parts[p] if q in c} for c in found_cycles for p in c}
    assert not upward, upward


def test_every_import_of_the_package_names_a_module_of_it(tmp_path):
    assert unresolved_imports(Tree(ROOT, PACKAGES)) == []
    _write(tmp_path, {**SYNTHETIC, "pkg/study/report.py": "def run():\n    from ...planning import psnr\n"})
    assert unresolved_imports(Tree(tmp_path, {"pkg": "pkg"})) == ["pkg.study.report:2: from ...planning import psnr"]


def test_the_part_graph_sees_function_level_imports_and_names_taken_from_the_root():
    g = module_graph(Tree(ROOT, PACKAGES), "worldstep")
    assert "worldstep.world" in g["worldstep.lerobot.replay"]  # `from worldstep.world import load` in a function
    assert "worldstep.world" in g["worldstep.bench.serve"]  # `from worldstep import make_env`, through the root
    parts = part_graph(g, "worldstep")
    assert {"worldstep.envs", "worldstep.engine", "worldstep.planning", "worldstep.fidelity"} <= set(parts)
    assert "worldstep" not in parts and "worldstep.measures" in parts["worldstep.fidelity"]


# --- the rules, shown to fail on injected violations ------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


SYNTHETIC = {
    "pkg/__init__.py": "from .world import load\n",
    "pkg/world.py": "def load():\n    return 1\n",
    "pkg/measures.py": "def psnr():\n    return 60.0\n",
    "pkg/planning.py": "from .measures import psnr\n",
    "pkg/study/__init__.py": "",
    "pkg/study/report.py": "from pkg import load\nfrom ..planning import psnr\n",
}


def test_a_clean_synthetic_package_passes(tmp_path):
    _write(tmp_path, SYNTHETIC)
    found_cycles, upward, parts = _rules(tmp_path, {"pkg": "pkg"}, "pkg", ("pkg.study",))
    assert (found_cycles, upward) == ([], [])
    assert set(parts["pkg.study"]) == {"pkg.world", "pkg.planning"}  # `from pkg import load` -> pkg.world


def test_a_function_level_import_of_research_is_a_cycle_and_an_upward_edge(tmp_path):
    _write(tmp_path, {**SYNTHETIC, "pkg/planning.py": """
        from .measures import psnr

        def rank():
            from .study.report import load
            return load
    """})
    found_cycles, upward, _ = _rules(tmp_path, {"pkg": "pkg"}, "pkg", ("pkg.study",))
    assert found_cycles == [["pkg.planning", "pkg.study"]]
    assert upward == ["pkg.planning -> pkg.study.report"]


def test_a_cycle_through_the_root_is_seen(tmp_path):
    """world -> planning -> measures -> world, the last edge spelled ``from pkg import load`` (resolved to
    ``pkg.world`` through the root's re-export)."""
    _write(tmp_path, {**SYNTHETIC, "pkg/world.py": "def load():\n    from pkg.planning import psnr\n    return psnr\n",
                      "pkg/measures.py": "def psnr():\n    from pkg import load\n    return load\n"})
    found_cycles, upward, _ = _rules(tmp_path, {"pkg": "pkg"}, "pkg", ("pkg.study",))
    assert found_cycles == [["pkg.measures", "pkg.planning", "pkg.world"]] and upward == []


def test_the_rules_fail_on_a_copy_of_this_tree_with_the_old_cycle_put_back(tmp_path):
    """planning importing the fidelity report inside a function (the edge that once made 13 parts one cycle):
    planning -> fidelity is research imported by the product, and fidelity.tasks -> planning closes a loop."""
    for folder in PACKAGES:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    planning = tmp_path / "sdk" / "planning.py"
    planning.write_text(planning.read_text() + "\n\ndef _report():\n    from .fidelity.report import main\n"
                        "    return main\n")
    found_cycles, upward, _ = _rules(tmp_path, PACKAGES, "worldstep", RESEARCH, DISPATCHER)
    assert upward == ["worldstep.planning -> worldstep.fidelity.report"]
    assert any({"worldstep.planning", "worldstep.fidelity"} <= set(c) for c in found_cycles), found_cycles
    dispatcher_only = _rules(tmp_path, PACKAGES, "worldstep", RESEARCH, DISPATCHER | {"worldstep.planning"})[1]
    assert dispatcher_only == []  # the same edge, from a module the rule lets name research, is not reported
