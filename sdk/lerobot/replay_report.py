"""The replay's report: per-window means over episodes with 95% bootstrap intervals (episodes resampled), per
series (model, first frame held, VAE round trip) and metric (PSNR dB, SSIM), the model against each baseline with
a plain verdict, and the files it is written to.

Neither baseline bounds the model on every metric (on SSIM the held first frame can beat the VAE round trip), so
each is named for what it is and the model is compared with both, per metric."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..charts import line_chart
from ..measures.intervals import mean_estimate, per_window_estimates
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
            "series": series, "verdicts": _verdicts(results, seed),
            "notes": "per-window means over episodes; ci95: percentile bootstrap over episodes (2000 resamples); "
                     "first_frame_held: the recorded first frame repeated (a model that predicts no motion); "
                     "vae_round_trip: the recorded frames through the VAE (what the autoencoder alone loses); "
                     "neither bounds every metric. verdicts: the model's per-episode mean minus the baseline's, "
                     "above/below when its interval excludes 0, else within"}


BASELINES = {"first_frame_held": "held first frame", "vae_round_trip": "VAE round trip"}
"""The baselines a replay compares the model with, and how a summary names them."""


def _verdicts(results: list[EpisodeScores], seed: int) -> dict[str, dict[str, Any]]:
    """Per metric and baseline: the paired difference (model - baseline, per-episode means) with its interval, and
    ``above``, ``below`` or ``within``."""
    out: dict[str, dict[str, Any]] = {}
    for m, metric in enumerate(METRICS):
        model = np.nanmean(_matrix(results, "model", metric), axis=1)
        out[metric] = {}
        for b, baseline in enumerate(BASELINES):
            difference = mean_estimate(model - np.nanmean(_matrix(results, baseline, metric), axis=1),
                                       seed=seed + 100 + 10 * b + m)
            verdict = "above" if difference.low > 0 else "below" if difference.high < 0 else "within"
            out[metric][baseline] = {"difference": difference.to_dict(), "verdict": verdict}
    return out


def summary_line(report: dict[str, Any]) -> str:
    """Per metric, the model's mean with its interval, both baselines', and the model's verdict against each."""
    parts = []
    for metric, label, f in (("psnr_db", "PSNR (dB)", ".2f"), ("ssim", "SSIM", ".3f")):
        model = report["series"]["model"][metric]["mean"]
        means = ", ".join(f"{name} {report['series'][key][metric]['mean']['value']:{f}}"
                          for key, name in BASELINES.items())
        verdicts = ", ".join(f"{report['verdicts'][metric][key]['verdict']} the {name}"
                             for key, name in BASELINES.items())
        parts.append(f"{label}: model {model['value']:{f}} [{model['ci95'][0]:{f}}, {model['ci95'][1]:{f}}], "
                     f"{means}: model {verdicts}")
    return "; ".join(parts)


def write_replay(out: Path, report: dict[str, Any], results: list[EpisodeScores]) -> list[str]:
    """``report.json``, ``records/episodes.jsonl`` and one chart per metric (``psnr.png``, ``ssim.png``)."""
    (out / "records").mkdir(parents=True, exist_ok=True)
    records = out / "records" / "episodes.jsonl"
    tmp = records.with_name(".episodes.jsonl.tmp")
    tmp.write_text("".join(json.dumps(r.to_record()) + "\n" for r in results))
    tmp.replace(records)
    charts = [_chart(out / "psnr.png", report, "psnr_db", "PSNR per window (dB), mean over episodes, 95% CI", "dB"),
              _chart(out / "ssim.png", report, "ssim", "SSIM per window, mean over episodes, 95% CI", "SSIM")]
    write_json(out / "report.json", report)
    return [str(out / "report.json"), str(records), *map(str, charts)]


def _chart(path: Path, report: dict[str, Any], metric: str, title: str, unit: str) -> Path:
    """One line per series, each labelled for what it is, with its per-window interval as bars."""
    names = {"model": "model", **BASELINES}
    rows = {names[s]: report["series"][s][metric] for s in SERIES}
    return line_chart(path, {k: r["value"] for k, r in rows.items()}, title, "window", unit,
                      intervals={k: (r["low"], r["high"]) for k, r in rows.items()})
