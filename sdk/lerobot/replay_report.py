"""The replay's report: per-window means over episodes with 95% bootstrap intervals (episodes resampled), per
series (model, first frame held, VAE round trip) and metric (PSNR dB, SSIM), and the files it is written to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..fidelity.plots import line_chart
from ..fidelity.stats import mean_estimate, per_window_estimates
from ..outputs import write_json
from .replay_scores import METRICS, SERIES, EpisodeScores


def _matrix(results: list[EpisodeScores], series: str, metric: str) -> np.ndarray:
    """``[episodes, windows]`` per-window means, NaN past an episode's last window."""
    width = max(r.windows for r in results)
    out = np.full((len(results), width), np.nan)
    for i, r in enumerate(results):
        out[i, :r.windows] = r.scores[series][metric]
    return out


def replay_report(results: list[EpisodeScores], settings: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """``report.json``: the settings, the episodes replayed, and per series and metric the per-window estimates
    (``value``, ``low``, ``high``, ``episodes`` counted in each window) and the mean over all windows."""
    series: dict[str, Any] = {}
    for s, name in enumerate(SERIES):
        series[name] = {}
        for m, metric in enumerate(METRICS):
            values = _matrix(results, name, metric)
            estimates = per_window_estimates(values, seed=seed + 10 * s + m)
            overall = mean_estimate(np.nanmean(values, axis=1), seed=seed + 10 * s + m)
            series[name][metric] = {"value": [e.value for e in estimates], "low": [e.low for e in estimates],
                                    "high": [e.high for e in estimates],
                                    "episodes": [int(n) for n in np.isfinite(values).sum(axis=0)],
                                    "mean": overall.to_dict()}
    return {"settings": settings, "episodes": [r.index for r in results], "windows": [r.windows for r in results],
            "series": series,
            "notes": "per-window means over episodes; ci95: percentile bootstrap over episodes (2000 resamples); "
                     "vae_round_trip is the ceiling, first_frame_held the floor a moving scene should beat"}


def write_replay(out: Path, report: dict[str, Any], results: list[EpisodeScores]) -> list[str]:
    """``report.json``, ``records/episodes.jsonl`` and one chart per metric (``psnr.png``, ``ssim.png``)."""
    (out / "records").mkdir(parents=True, exist_ok=True)
    records = out / "records" / "episodes.jsonl"
    tmp = records.with_name(".episodes.jsonl.tmp")
    tmp.write_text("".join(json.dumps(r.to_record()) + "\n" for r in results))
    tmp.replace(records)
    charts = [line_chart(out / "psnr.png", {s: report["series"][s]["psnr_db"]["value"] for s in SERIES},
                         "PSNR per window (dB), mean over episodes", "window", "dB"),
              line_chart(out / "ssim.png", {s: report["series"][s]["ssim"]["value"] for s in SERIES},
                         "SSIM per window, mean over episodes", "window", "SSIM")]
    write_json(out / "report.json", report)
    return [str(out / "report.json"), str(records), *map(str, charts)]
