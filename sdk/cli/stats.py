"""``worldstep stats``: per-dimension action statistics for ``ActionNormalizer``."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from ..flags import flag


@dataclass
class StatsFlags:
    """``worldstep stats``."""

    source: str = flag(".npy, .npz, a .parquet file or a LeRobot dataset folder (data/**/*.parquet)",
                       positional=True)
    column: str = flag("parquet column holding the actions", default="action")
    key: str | None = flag(".npz array name (default actions, action or the only array)", default=None)
    dims: str | None = flag("keep dimensions START:STOP, e.g. 0:10", default=None)
    out: str | None = flag("write the stats JSON (cosmos-framework's normalizer-stats format) here", default=None)
    json: bool = flag("print the stats JSON instead of a table", default=False)


def cmd_stats(args: argparse.Namespace) -> int:
    from worldstep.engine.embodiment.action_stats import STAT_KEYS, ActionStats

    from ..action_data import load_array_actions, load_lerobot_actions

    source = Path(args.source)
    if source.suffix in (".npy", ".npz"):
        rows, meta = load_array_actions(source, key=args.key), {"source": str(source)}
    else:
        rows, meta = load_lerobot_actions(source, column=args.column)
    if args.dims is not None:
        start, _, stop = args.dims.partition(":")
        if not (start.isdigit() and stop.isdigit() and int(start) < int(stop) <= rows.shape[1]):
            raise ValueError(f"--dims {args.dims!r} is invalid; allowed: START:STOP with 0 <= START < STOP <= "
                             f"{rows.shape[1]}")
        rows, meta["dims"] = rows[:, int(start):int(stop)], args.dims
    stats = ActionStats.compute(rows, metadata=meta)
    if args.out:
        stats.to_json(args.out)
    if args.json:
        print(json.dumps(stats.to_dict(), indent=2))
        return 0
    print(f"{stats.metadata['count']} action rows, {stats.width} dimensions, from {source}")
    print("dim " + "".join(f"{k:>12}" for k in STAT_KEYS))
    for d in range(stats.width):
        print(f"{d:>3} " + "".join(f"{float(getattr(stats, k)[d]):>12.5g}" for k in STAT_KEYS))
    if args.out:
        print(f"wrote {args.out}")
    return 0
