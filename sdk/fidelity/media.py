"""The fidelity report's charts and its truth | kv | VAE-copy video, for the sections a report has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..charts import bar_chart, line_chart
from ..recipes.side_by_side import side_by_side_mp4


def write_media(out: Path, open_loop: dict[str, Any] | None, policies: dict[str, Any] | None,
                 videos: dict[str, np.ndarray] | None, video_clips: int) -> list[str]:
    """The report's charts (and a truth | kv | VAE-copy mp4 of `video_clips` clips) for the sections it has."""
    files = []
    if open_loop is not None:
        s = open_loop["series"]
        names = ("kv", "kv_shuffled_actions", "copy_first_frame_vae", "vae_reconstruction_ceiling")
        files += [
            line_chart(out / "psnr.png", {k: s[k]["psnr_db"]["value"] for k in names}, "PSNR per window (dB)",
                       "window", "dB"),
            line_chart(out / "ssim.png", {k: s[k]["ssim"]["value"] for k in names}, "SSIM per window", "window",
                       "SSIM"),
            line_chart(out / "object_vanish.png", {f"{k} {obj}": s[k][f"{obj}_vanish_rate"]["value"]
                                                   for k in ("kv", "vae_reconstruction_ceiling")
                                                   for obj in ("effector", "block")},
                       "share of frames where the detector loses the object", "window", "rate"),
            line_chart(out / "moved_block_error.png",
                       {k: s[k]["moved_block_error_px"]["value"] for k in ("kv", "copy_first_frame_vae",
                                                                             "vae_reconstruction_ceiling")},
                       "block error on frames where the block moved (vanished = 32 px)", "window", "px"),
        ]
        n = min(video_clips, len(videos["truth"]))
        if n:
            cols = [np.concatenate(list(videos[k][:n]), axis=0) for k in ("truth", "kv", "copy_first_frame_vae")]
            files.append(side_by_side_mp4(out / "rollouts_sim_kv_copy.mp4", cols))
    if policies is not None:
        per = policies["per_policy"]
        files.append(bar_chart(out / "policy_success.png", [p["policy"] for p in per],
                               {"simulator": [p["sim_success"]["value"] for p in per],
                                "world model": [p["model_success"]["value"] for p in per]},
                               "success rate (bars: 95% bootstrap intervals)", "success",
                               intervals={"simulator": [p["sim_success"]["ci95"] for p in per],
                                          "world model": [p["model_success"]["ci95"] for p in per]}))
    return [str(f) for f in files]
