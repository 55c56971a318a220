"""`docs/internals.md` names every module of `sdk/`, `envs/` and `engine/`, each once with a line on what it holds,
and names no module that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sdk", "envs", "engine")
SECTION = "## Every module"
ENTRY = re.compile(r"^- `((?:sdk|envs|engine)/[\w/]+\.py)`:(.*)$", re.MULTILINE)
PATH = re.compile(r"`((?:sdk|envs|engine)/[\w/]*\.py)`")


def modules(root: Path) -> set[str]:
    """Every Python module of the three packages, as its path from the repository root."""
    return {p.relative_to(root).as_posix() for package in PACKAGES for p in (root / package).rglob("*.py")
            if "__pycache__" not in p.parts}


def map_problems(text: str, present: set[str]) -> list[str]:
    """What is wrong with the doc's module map against the modules ``present``: one block per kind of fault,
    each listing exactly the paths at fault (the missing ones as lines ready to fill in)."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0] if SECTION in text else ""
    entries = ENTRY.findall(section)
    named = [path for path, _ in entries]
    problems = []
    missing = sorted(present - set(named))
    if missing:
        problems.append(f"docs/internals.md does not name these modules; add under {SECTION!r}:\n"
                        + "\n".join(f"- `{path}`: " for path in missing))
    stale = sorted({path for path in PATH.findall(text) if path not in present})
    if stale:
        problems.append("docs/internals.md names modules that do not exist:\n" + "\n".join(stale))
    twice = sorted({path for path in named if named.count(path) > 1})
    if twice:
        problems.append(f"docs/internals.md names these modules more than once under {SECTION!r}:\n"
                        + "\n".join(twice))
    bare = sorted(path for path, line in entries if not line.strip())
    if bare:
        problems.append("docs/internals.md names these modules without saying what they hold:\n" + "\n".join(bare))
    return problems


def test_the_doc_names_every_module_and_no_other():
    problems = map_problems((ROOT / "docs" / "internals.md").read_text(), modules(ROOT))
    assert not problems, "\n\n".join(problems)


def _tree(root: Path, paths: set[str]) -> set[str]:
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).touch()
    return modules(root)


def test_the_check_fails_on_an_unnamed_module_and_a_stale_name(tmp_path):
    """A copy of the tree's module files plus one new module, against the real doc plus one removed module."""
    doc = (ROOT / "docs" / "internals.md").read_text()
    tree = _tree(tmp_path, modules(ROOT) | {"engine/new_helper.py", "sdk/serve/new_part.py"})
    assert "engine/new_helper.py" in tree and "__pycache__" not in "".join(tree)
    assert map_problems(doc, tree) == [
        f"docs/internals.md does not name these modules; add under {SECTION!r}:\n"
        "- `engine/new_helper.py`: \n- `sdk/serve/new_part.py`: "]
    gone = doc.replace("- `engine/kv/offload.py`:", "- `engine/kv/offload.py`: x\n- `engine/kv/gone.py`:")
    assert map_problems(gone, modules(ROOT)) == ["docs/internals.md names modules that do not exist:\n"
                                                 "engine/kv/gone.py"]


def test_the_check_fails_on_a_module_named_twice_or_without_a_line():
    doc = (ROOT / "docs" / "internals.md").read_text()
    twice = doc.replace("- `envs/pose.py`:", "- `envs/pose.py`: again\n- `envs/pose.py`:")
    assert map_problems(twice, modules(ROOT)) == [
        f"docs/internals.md names these modules more than once under {SECTION!r}:\nenvs/pose.py"]
    bare = re.sub(r"^- `envs/scene\.py`:.*$", "- `envs/scene.py`:", doc, flags=re.MULTILINE)
    assert map_problems(bare, modules(ROOT)) == [
        "docs/internals.md names these modules without saying what they hold:\nenvs/scene.py"]
    assert map_problems(doc.replace(SECTION, "## Some modules"), {"envs/pose.py"})[0].startswith(
        "docs/internals.md does not name these modules")
