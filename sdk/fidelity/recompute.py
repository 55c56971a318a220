"""`python -m worldstep.fidelity.recompute OUT`: rebuild every figure of OUT/report.json from OUT/records/.

Exit status 0 when each section recomputed from the per-unit records equals the report's, 1 otherwise
(the differing keys are printed).
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worldstep.envs.push_seeds import range_of

from ..flags import flag, parse_flags
from .provenance import code_state
from .records import read_records
from .report import FidelityArgs, sections


def differences(a: Any, b: Any, where: str = "", added: list[str] | None = None) -> list[str]:
    """Paths at which two JSON values differ. With `added`, keys only `b` has are listed there instead (figures
    the code computes now that report `a` predates), and everything `a` has must still match."""
    if isinstance(a, dict) and isinstance(b, dict):
        only_b = sorted(set(b) - set(a)) if added is not None else []
        if added is not None:
            added += [f"{where}/{k}" for k in only_b]
        out = [f"{where}/{k}: missing on one side" for k in sorted((set(a) ^ set(b)) - set(only_b))]
        for k in sorted(set(a) & set(b)):
            out += differences(a[k], b[k], f"{where}/{k}", added)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]", added)]
    if isinstance(a, str) and isinstance(b, str) and where.endswith("/target") and b.startswith(f"{a}, "):
        return []  # a target's wording gained a clause (the stop the planner used); its threshold is a's
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def recompute(out: Path) -> tuple[dict[str, Any], list[str], list[str]]:
    """The sections rebuilt from `out`'s records, where they differ from its report.json, and the figures the
    report predates (computed now from the same records, reported beside it, never a difference)."""
    report = json.loads((out / "report.json").read_text())
    known = set(FidelityArgs.__dataclass_fields__)
    args = FidelityArgs(**{k: v for k, v in report["args"].items() if k in known})
    if report.get("episode_seeds"):  # the range by its seeds: a sealed range is renamed once a report has read it
        args.split = range_of(report["episode_seeds"][0]).name
    rebuilt = json.loads(json.dumps(sections(read_records(out), args, report["settings"]["chunk_size"])))
    added: list[str] = []
    diffs = differences({k: report.get(k) for k in rebuilt}, rebuilt, added=added)
    return rebuilt, diffs, added


def with_added(report: dict[str, Any], rebuilt: dict[str, Any], added: list[str]) -> dict[str, Any]:
    """`report` unchanged, plus the figures it predates from `rebuilt`, and which commit computed them."""
    out = copy.deepcopy(report)
    for path in added:
        *parents, key = path.strip("/").split("/")
        src, dst = rebuilt, out
        for part in parents:
            src, dst = src[part], dst.setdefault(part, {})
        dst[key] = src[key]
    out["recomputed"] = {"added": added, **code_state()}
    return out


@dataclass
class RecomputeArgs:
    out: str = flag("a report folder written by worldstep fidelity (report.json and records/)", positional=True)
    write: str | None = flag("also write report.json with the figures it predates added (each figure it has left "
                             "as it is; `recomputed` names the commit that added them) to this file; only when "
                             "nothing differs", default=None)


def main(argv: list[str] | None = None) -> int:
    args = parse_flags(RecomputeArgs, argv, prog="python -m worldstep.fidelity.recompute", description=__doc__)
    out = Path(args.out)
    if args.write is not None and not Path(args.write).resolve().parent.is_dir():
        raise ValueError(f"--write={args.write} is invalid; allowed: a file in a folder that exists")
    rebuilt, diffs, added = recompute(out)
    for line in diffs:
        print(line)
    if added:
        print(f"figures the report predates, computed from its records: {', '.join(added)}")
        for path in added:
            value: Any = rebuilt
            for part in path.strip("/").split("/"):
                value = value[part]
            print(f"{path} = {json.dumps(value)}")
    if args.write is not None and not diffs:
        report = json.loads((out / "report.json").read_text())
        Path(args.write).write_text(json.dumps(with_added(report, rebuilt, added), indent=1))
    print(f"{'recomputed' if not diffs else 'DIFFERS'}: {', '.join(rebuilt)} from {out / 'records'}"
          f"{'' if not diffs else f' ({len(diffs)} differences)'}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
