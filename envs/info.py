"""The info keys of a world-model step that hold the engine's records, in one list, and their two forms: the
records themselves (what ``env.step`` returns) or dicts of numbers (a vector env's one array per field, the
server's wire). Imports no engine code until a record is rebuilt, so a remote client stays light."""

from __future__ import annotations

import dataclasses
from typing import Any

RECORD_KEYS = ("timings", "kv")  # the engine's PhaseTimings and KVStats, in this order


def flat_records(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` with each record as a dict of numbers."""
    return {k: dataclasses.asdict(v) if k in RECORD_KEYS and dataclasses.is_dataclass(v) else v
            for k, v in info.items()}


def records_from(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` with each record's dict of numbers made the engine's record again (the inverse of `flat_records`)."""
    if not any(k in info for k in RECORD_KEYS):
        return info
    from worldstep.engine.spec import KVStats, PhaseTimings

    records = dict(zip(RECORD_KEYS, (PhaseTimings, KVStats)))
    return {k: records[k](**v) if k in records and isinstance(v, dict) else v for k, v in info.items()}
