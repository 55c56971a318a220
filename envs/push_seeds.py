"""PushSim's seed splits: a validation range for development, a sealed test range for reports.

They live beside the simulator (``push_sim.py``) because they name its scenes: training keeps clear of them,
and the fidelity studies and the dataset export draw their starts from them.

Every start state of an evaluation (policy and planner episodes, held-out open-loop clips) is
`PushSimEnv.reset(seed=s)` for a seed `s` of one range, so a range names a fixed set of scenes.

- ``validation`` (20,000,000 .. 20,009,999): choosing models, hyperparameters, policies, planner settings and
  the demo seed; run it as often as you like.
- ``test`` (70,000,000 .. 70,009,999): SEALED. Used once, at the end, for the figures a report states;
  never to choose anything. Its results are not fed back into training or settings.
- ``test_read`` (30,000,000 .. 30,009,999), ``test_read_2`` (40,000,000 ..), ``test_read_3`` (50,000,000 ..)
  and ``test_read_4`` (60,000,000 ..): earlier sealed ranges, each read once by a report (the shipped pusher's
  first to fourth sealed runs; the fourth is the trust run), so they can no longer seal anything; they stay
  addressable to reproduce those reports, and no seed of them is reused.

Neither range overlaps a seed used before them: tests and examples use seeds below 1,000; the previous
fidelity report used 5,000..5,009 and clip seed 777,000; the Makefile demo used seed 4; training draws its
clips' reset seeds from a generator (`generate_clips`), and a test checks that the default run's draws
miss both ranges.
"""

from __future__ import annotations

from dataclasses import dataclass

EPISODE_OFFSET = 0  # episodes (policies, planner) use seeds start + 0 ..
CLIP_OFFSET = 5_000  # held-out open-loop clips use seeds start + 5000 ..


@dataclass(frozen=True)
class SeedRange:
    """`size` consecutive seeds from `start`."""

    name: str
    start: int
    size: int

    def seeds(self, count: int, offset: int = 0) -> list[int]:
        """`count` seeds from `start + offset`; ValueError when they run past the range."""
        if count < 0 or offset < 0 or offset + count > self.size:
            raise ValueError(f"count={count}, offset={offset} is invalid for the {self.name} range; allowed: "
                             f"0 <= offset and offset + count <= {self.size}")
        return list(range(self.start + offset, self.start + offset + count))

    def __contains__(self, seed: object) -> bool:
        return isinstance(seed, int) and self.start <= seed < self.start + self.size

    def episode_seeds(self, count: int) -> list[int]:
        return self.seeds(count, EPISODE_OFFSET)

    def clip_seeds(self, count: int) -> list[int]:
        return self.seeds(count, CLIP_OFFSET)


VALIDATION = SeedRange("validation", 20_000_000, 10_000)
# Start seeds of training's DAgger round (policies closed loop on a trained model): training data, so never
# inside an evaluation range.
DAGGER = SeedRange("dagger", 10_000_000, 10_000)
SEALED_TEST = SeedRange("test", 70_000_000, 10_000)
# Sealed once, read by a report since: oldest first.
READ_TESTS = (SeedRange("test_read", 30_000_000, 10_000), SeedRange("test_read_2", 40_000_000, 10_000),
              SeedRange("test_read_3", 50_000_000, 10_000), SeedRange("test_read_4", 60_000_000, 10_000))
SPLITS = {r.name: r for r in (VALIDATION, SEALED_TEST, *READ_TESTS)}


def split_range(name: str) -> SeedRange:
    """The range called `name` (`validation`, `test`, or a read one: `test_read` .. `test_read_4`)."""
    if name not in SPLITS:
        raise ValueError(f"split={name!r} is invalid; allowed: {sorted(SPLITS)}")
    return SPLITS[name]


def range_of(seed: int) -> SeedRange:
    """The named range holding `seed`: a report keeps its seeds, and a range can be renamed once it has been read
    (the sealed `test` range of the shipped pusher's fourth report is `test_read_4` today)."""
    for r in SPLITS.values():
        if seed in r:
            return r
    raise ValueError(f"seed={seed} is invalid; allowed: a seed of one of the ranges {sorted(SPLITS)}")
