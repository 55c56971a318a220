"""The embodiment table (docs/embodiments.md), generated from the registry so the two never drift.

A doc generator, kept out of the installed package (`tools/` is not in pyproject's packages):

    python tools/embodiment_table.py            # print the table
    python tools/embodiment_table.py docs/embodiments.md  # rewrite the block between the markers in place
"""

from __future__ import annotations

import sys
from pathlib import Path

from worldstep.engine.embodiment.embodiments import EmbodimentRegistry

BEGIN = "<!-- embodiment-table:begin (python tools/embodiment_table.py docs/embodiments.md) -->"
END = "<!-- embodiment-table:end -->"


def render(registry: EmbodimentRegistry | None = None) -> str:
    """One Markdown row per embodiment: name, domain id, raw width, fps, view point, normalisation, source."""
    registry = registry or EmbodimentRegistry.default()
    lines = ["| embodiment | domain id | width | fps | view point | normalisation | source |",
             "|---|---|---|---|---|---|---|"]
    for e in sorted(registry, key=lambda e: e.domain_id):  # stable: an id's first row is what by_domain_id gives
        fps = f"{e.default_fps:g}" if e.default_fps is not None else "–"
        norm = e.normalization.value if e.normalization is not None else "–"
        lines.append(f"| `{e.name}` | {e.domain_id} | {e.raw_width} | {fps} | {e.default_view_point} | {norm} | "
                     f"{e.source.value} |")
    return "\n".join(lines)


def update(path: str | Path) -> bool:
    """Rewrite the block between the markers of `path`; True when it changed."""
    path = Path(path)
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{path} lacks the markers {BEGIN!r} ... {END!r}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{render()}\n{END}{tail}"
    if new != text:
        path.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(render())
        return 0
    for name in argv:
        print(f"{name}: {'updated' if update(name) else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
