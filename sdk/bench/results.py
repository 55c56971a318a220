"""What a bench run hands back: figures for `--json`, and tables for the terminal and the docs.

The JSON is the source of truth (`schema`, `bench`, `machine`, `settings`, `results`, `tables`,
`notes`); the README and docs/performance.md tables are rendered from it by `worldstep.bench.report`.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from worldstep.outputs import json_safe, write_json

SCHEMA = 1

Cell = str | int | float | None


@dataclass
class Table:
    """A titled table; numbers stay numbers until rendered."""

    title: str
    columns: list[str]
    rows: list[list[Cell]] = field(default_factory=list)
    note: str = ""

    def add(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"row {cells!r} has {len(cells)} cells; table '{self.title}' has {len(self.columns)}")
        self.rows.append(list(cells))


@dataclass
class BenchResult:
    """One subcommand's output."""

    bench: str
    machine: dict[str, Any]
    settings: dict[str, Any]
    results: dict[str, Any] = field(default_factory=dict)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    schema: int = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))

    def write_json(self, path: str | os.PathLike) -> Path:
        return write_json(path, self.to_dict())


def format_cell(value: Cell) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "–"
        magnitude = abs(value)
        if magnitude >= 100:
            return f"{value:,.0f}"
        if magnitude >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    return str(value)


def render_table(table: Table | dict[str, Any]) -> str:
    """GitHub markdown for one table (a `Table` or its JSON dict)."""
    if isinstance(table, Table):
        table = asdict(table)
    lines = [f"**{table['title']}**", "", "| " + " | ".join(table["columns"]) + " |",
             "|" + "|".join("---" for _ in table["columns"]) + "|"]
    lines += ["| " + " | ".join(format_cell(c) for c in row) + " |" for row in table["rows"]]
    if table.get("note"):
        lines += ["", table["note"]]
    return "\n".join(lines)
