"""`python -m worldstep.fidelity.recompute OUT`: rebuild every figure of OUT/report.json from OUT/records/.

Exit status 0 when each section recomputed from the per-unit records equals the report's, 1 otherwise
(the differing keys are printed).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..flags import flag, parse_flags
from .records import read_records
from .report import FidelityArgs, sections


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Paths at which two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}/{k}: missing on one side" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += differences(a[k], b[k], f"{where}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def recompute(out: Path) -> tuple[dict[str, Any], list[str]]:
    """The sections rebuilt from `out`'s records, and where they differ from its report.json."""
    report = json.loads((out / "report.json").read_text())
    args = FidelityArgs(**report["args"])
    rebuilt = json.loads(json.dumps(sections(read_records(out), args, report["settings"]["chunk_size"])))
    return rebuilt, differences({k: report.get(k) for k in rebuilt}, rebuilt)


@dataclass
class RecomputeArgs:
    out: str = flag("a report folder written by worldstep fidelity (report.json and records/)", positional=True)


def main(argv: list[str] | None = None) -> int:
    out = Path(parse_flags(RecomputeArgs, argv, prog="python -m worldstep.fidelity.recompute",
                           description=__doc__).out)
    rebuilt, diffs = recompute(out)
    for line in diffs:
        print(line)
    print(f"{'recomputed' if not diffs else 'DIFFERS'}: {', '.join(rebuilt)} from {out / 'records'}"
          f"{'' if not diffs else f' ({len(diffs)} differences)'}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
