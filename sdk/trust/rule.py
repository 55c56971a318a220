"""The selective judge's rule: a small frozen set of thresholds on the trust signals, fitted on validation records
and then never changed; its hash goes into each report's provenance, so a figure names the rule that made it."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from .signals import TrustSignals

SIGNALS = ("horizon", "consistency", "agreement", "persistence")


@dataclass(frozen=True)
class SelectiveRule:
    """Thresholds a success must pass to be claimed (None: the signal is not used). `horizon_max`: window over the
    trained horizon at most this; `consistency_max`: tracker residual (px) at most this; `agreement_min`: share of
    agreeing forks at least this; `persistence_min`: success held for at least this many windows."""

    horizon_max: float | None = None
    consistency_max: float | None = None
    agreement_min: float | None = None
    persistence_min: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{f.name}={value!r} is invalid; allowed: None or a finite number >= 0")
        if self.agreement_min is not None and self.agreement_min > 1:
            raise ValueError(f"agreement_min={self.agreement_min!r} is invalid; allowed: None or 0..1")
        if self.persistence_min is not None and int(self.persistence_min) != self.persistence_min:
            raise ValueError(f"persistence_min={self.persistence_min!r} is invalid; allowed: None or an int >= 0")

    def failing(self, signals: TrustSignals) -> str | None:
        """The first signal (in `SIGNALS` order) that fails its threshold or is missing where it is needed."""
        checks = (("horizon", self.horizon_max, lambda v, t: v <= t),
                  ("consistency", self.consistency_max, lambda v, t: v <= t),
                  ("agreement", self.agreement_min, lambda v, t: v >= t),
                  ("persistence", self.persistence_min, lambda v, t: v >= t))
        for name, threshold, passes in checks:
            if threshold is None:
                continue
            value = getattr(signals, name)
            if value is None or not passes(value, threshold):
                return name
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def sha256(self) -> str:
        """A hash of the thresholds (canonical JSON): what a report's provenance records."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SelectiveRule:
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"SelectiveRule got unknown thresholds {unknown}; allowed: {[f.name for f in fields(cls)]}")
        return cls(**data)
