"""No committed symbolic link leaves the checkout: a link to a folder on the machine it was made on (a helper
worktree's venv links, once) replaces that folder in every clone and breaks `make install` there."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def stray_links(root: Path) -> list[str]:
    """Tracked symbolic links (git mode 120000) whose target is absolute or resolves outside `root`."""
    listing = subprocess.run(["git", "ls-files", "-s"], cwd=root, capture_output=True, text=True, check=True).stdout
    out = []
    for line in listing.splitlines():
        mode, _, rest = line.partition(" ")
        if mode != "120000":
            continue
        path = rest.split("\t", 1)[1]
        target = os.readlink(root / path) if (root / path).is_symlink() else ""
        inside = (root / path).parent.joinpath(target).resolve().is_relative_to(root.resolve())
        if not target or os.path.isabs(target) or not inside:
            out.append(path)
    return out


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout (an unpacked sdist has no links)")
def test_no_tracked_link_leaves_the_checkout():
    assert stray_links(ROOT) == []


def test_a_link_out_of_the_checkout_is_found(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("a")
    (tmp_path / "inside").symlink_to("docs/a.md")
    (tmp_path / ".venv-openpi").symlink_to("/work/main/.venv-openpi")
    (tmp_path / "up").symlink_to("../elsewhere")
    git("add", "-A")
    assert stray_links(tmp_path) == [".venv-openpi", "up"]
