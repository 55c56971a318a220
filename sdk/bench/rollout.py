"""`worldstep bench rollout`: per-step speed against the alternatives, long-rollout flatness, and
pipelined open-loop rollouts."""

from __future__ import annotations

from .machine import describe_machine
from .pipelined import compare_pipelined, pipelined_table
from .progress import Progress
from .results import BenchResult
from .settings import RolloutSettings
from .steps import compare_steps
from .windows import scan_table, scan_windows

TARGETS = {"official_over_kv_min": 3.0, "late_over_early_max": 1.1}


def run_rollout(settings: RolloutSettings, progress: Progress) -> BenchResult:
    result = BenchResult("rollout", describe_machine(), settings=vars(settings).copy())
    result.results["targets"] = dict(TARGETS)
    steps = {}
    for arch in settings.archs:
        figures, table = compare_steps(arch, settings, progress)
        steps[arch] = figures
        result.tables.append(table)
        if figures["ratio_official_over_kv"] < TARGETS["official_over_kv_min"]:
            result.notes.append(
                f"{arch}: (c)/(a) = {figures['ratio_official_over_kv']:.2f} misses the >= 3 target "
                f"(decode is {figures['phases']['kv']['decode_ms']:.0f} of {figures['ms_per_step']['kv']:.0f} ms "
                "of a worldstep step; see docs/performance.md).")
    result.results["steps"] = steps
    if settings.scan_windows:
        scan = scan_windows(settings, progress)
        result.results["scan"] = scan
        result.tables.append(scan_table(scan))
        if scan["late_over_early_interleaved"] > TARGETS["late_over_early_max"]:
            result.notes.append(f"late/early = {scan['late_over_early_interleaved']:.2f} misses the <= 1.1 target.")
    if settings.pipeline_windows:
        pipelined = compare_pipelined(settings, progress)
        result.results["pipelined"] = pipelined
        result.tables.append(pipelined_table(pipelined))
    return result
