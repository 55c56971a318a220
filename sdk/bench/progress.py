"""Progress lines on stderr, so long bench runs show they are alive and stdout keeps only the tables."""

from __future__ import annotations

import sys
import time


class Progress:
    """`progress("small: round 3/8")` prints `[bench rollout +12.3s] small: round 3/8` unless quiet."""

    def __init__(self, bench: str, quiet: bool = False) -> None:
        self.bench = bench
        self.quiet = quiet
        self.start = time.perf_counter()

    def __call__(self, message: str) -> None:
        if not self.quiet:
            elapsed = time.perf_counter() - self.start
            print(f"[bench {self.bench} +{elapsed:.1f}s] {message}", file=sys.stderr, flush=True)
