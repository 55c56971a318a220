"""A world-model episode next to its simulator's truth: same start, same actions, frames side by side.

For a model trained on a simulator (its config's ``env.simulator``), the world-model env resets to the
simulator's first frame for the same seed; ``rollout_with_truth`` then feeds every action chunk the policy
chooses from the *model's* frames to both envs, so the video and the per-window PSNR show exactly where
the model's imagination and the simulator part ways.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm
from worldstep.envs.video import frame_fps, video_writer

from .episodes import EpisodeResult
from .measures.frames import psnr
from .policies import Policy

__all__ = ["TruthComparison", "WorldRecord", "rollout_with_truth", "side_by_side"]


@dataclass
class WorldRecord:
    """What one world (the model or the simulator) did in a truth comparison, judged by the simulator's pixel
    rule: the first window it succeeded in, and its state when it stopped (the video's last frame of it)."""

    windows: int = 0
    """windows this world stepped (a world that stops at its success holds its last frame after)"""
    success_window: int | None = None
    """the first window (0-based) whose frames the rule judged a success; None: never"""
    final_success: bool = False
    """the rule's verdict on this world's last frames: where the episode left it"""
    ended: str = "max_windows"
    """why this world stopped: success, max_windows, or the env's terminated/truncated"""

    def judged(self, window: int, success: bool) -> None:
        self.windows += 1
        self.final_success = success
        if success and self.success_window is None:
            self.success_window = window


@dataclass
class TruthComparison:
    """One episode in the model and the simulator: the common ``episode`` result (its ``success`` is the
    simulator's final verdict), ``psnr_db[k]``, window k's mean per-frame PSNR (the metric of ``worldstep
    fidelity``) over the windows both worlds stepped, and each world's record."""

    episode: EpisodeResult
    psnr_db: list[float] = field(default_factory=list)
    model: WorldRecord = field(default_factory=WorldRecord)
    simulator: WorldRecord = field(default_factory=WorldRecord)

    @property
    def model_success(self) -> bool:
        """The model's final state judged by the simulator's pixel rule (its frames, the simulator's goal)."""
        return self.model.final_success

    @property
    def truth_success(self) -> bool:
        """The simulator's final state judged by the same rule (the episode's ``success``)."""
        return self.episode.success

    @property
    def mean_psnr_db(self) -> float:
        return float(np.mean(self.psnr_db)) if self.psnr_db else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """The episode's fields and the comparison's, flat, with each world's record (a summary JSON)."""
        return {**self.episode.to_dict(), "psnr_db": list(self.psnr_db), "model_success": self.model_success,
                "truth_success": self.truth_success, "mean_psnr_db": self.mean_psnr_db,
                "worlds": {"model": asdict(self.model), "simulator": asdict(self.simulator)}}


HEADER_PX = 32
"""Height of the label strip above a labelled side-by-side video (two lines of text)."""


def side_by_side(left: np.ndarray, right: np.ndarray, scale: int = 4, gap: int = 2,
                 labels: tuple[str, str] | None = None, caption: str | None = None) -> np.ndarray:
    """``(T, H, W, 3)`` frames joined left | right with a white gap, upscaled ``scale``x (nearest).

    With ``labels`` (e.g. ``("model", "simulator")``) and/or ``caption`` (e.g. ``"window 3  PSNR 24.1 dB"``)
    a ``HEADER_PX`` strip above the frames names each half over it and shows the caption below the names.
    """
    bar = np.full((*left.shape[:2], gap, 3), 255, np.uint8)
    joined = np.concatenate([left, bar, right], axis=2)
    frames = joined.repeat(scale, axis=1).repeat(scale, axis=2)  # [T, H*scale, (2W+gap)*scale, 3]
    if labels is None and caption is None:
        return frames
    header = _header(frames.shape[2], (left.shape[2] + gap) * scale, labels, caption)
    return np.concatenate([np.broadcast_to(header, (len(frames), *header.shape)), frames], axis=1)


def _header(width: int, right_start: int, labels: tuple[str, str] | None, caption: str | None) -> np.ndarray:
    """``[HEADER_PX, width, 3]`` uint8: the halves' names at their left edges, the caption centred below."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, HEADER_PX), (0, 0, 0))
    draw = ImageDraw.Draw(image)
    font = _font()
    if labels is not None:
        draw.text((4, 2), labels[0], fill=(255, 255, 255), font=font)
        draw.text((right_start + 4, 2), labels[1], fill=(255, 255, 255), font=font)
    if caption is not None:
        text_width = draw.textlength(caption, font=font)
        draw.text(((width - text_width) / 2, HEADER_PX // 2 + 1), caption, fill=(255, 220, 120), font=font)
    return np.asarray(image)


@lru_cache(maxsize=1)
def _font() -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=12)
    except (ImportError, OSError, TypeError):  # a Pillow without FreeType: its bitmap font
        return ImageFont.load_default()


def _caption(window: int | None, psnr_db: float | None, note: str = "") -> str:
    if window is None:
        return "first frame"
    if psnr_db is None:
        return f"window {window}   {note}"
    return f"window {window}   PSNR {psnr_db:.1f} dB" + (f"   {note}" if note else "")


def rollout_with_truth(env: gym.Env, truth: gym.Env, policy: Policy, *, seed: int = 0, max_windows: int = 8,
                       video_path: str | os.PathLike | None = None, scale: int = 4,
                       progress: bool = False, on_window: Callable[[], Any] | None = None,
                       on_truth: Callable[[np.ndarray], Any] | None = None, run_on: bool = False) -> TruthComparison:
    """Closed loop on the model (the policy sees the model's frames); the simulator replays each chunk.

    ``env`` must reset to the simulator's first frame for ``seed`` (a model env made with ``simulator``). Each
    world is judged every window by the simulator's pixel rule ``success_from_frames`` (goal from the
    simulator's first frame) and, unless ``run_on``, stops at its own first success: the simulator holds its
    last frame while the model goes on; the episode ends when the model succeeds, the model env ends it, or
    after ``max_windows``. With ``run_on`` both run every window, so a success can be undone; each world's
    record keeps its first success window and its final verdict either way. PSNR is per window both stepped.
    The video labels its halves (model | the simulator's id) and shows each window's number and PSNR; it is
    renamed into place when the episode ends (an exception leaves ``video_path`` as it was). ``on_truth`` gets
    the simulator's first frame after the reset and its frames after each window (e.g. ``RerunLogger.log_truth``).
    """
    if getattr(env.unwrapped, "simulator", None) is None:
        raise ValueError("env is invalid; allowed: a world-model env made with a `simulator` "
                         "(config env.simulator, e.g. worldstep/Pusher-v0)")
    start = time.perf_counter()
    result = TruthComparison(EpisodeResult.of_env(env, seed=seed))
    episode = result.episode
    policy.reset(seed)
    obs, info = env.reset(seed=seed)
    truth_obs, _ = truth.reset(seed=info.get("scene_seed", seed))
    if truth_obs["frames"].shape != obs["frames"].shape:
        raise ValueError(f"truth frames {truth_obs['frames'].shape} are invalid; allowed: the model env's "
                         f"frame shape {obs['frames'].shape} (same chunk size and frame size)")
    judge = getattr(truth.unwrapped, "success_from_frames", None)
    first = truth_obs["frames"][0]
    if on_truth is not None:
        on_truth(truth_obs["frames"][:1])
    labels = ("model", getattr(getattr(truth, "spec", None), "id", None) or "simulator")
    sim_frames = truth_obs["frames"][:1]
    with video_writer(video_path, frame_fps(env)) as writer, \
            tqdm(total=max_windows, desc="rollout+truth", unit="window", disable=not progress) as bar:
        if writer is not None:
            writer.write(side_by_side(obs["frames"][:1], sim_frames, scale, labels=labels,
                                      caption=_caption(None, None)))
            episode.video = str(writer.path)
        for window in range(max_windows):
            actions = policy(obs)
            obs, reward, terminated, truncated, info = env.step(actions)
            episode.windows += 1
            episode.frames += len(obs["frames"])
            episode.episode_return += float(reward)
            result.model.judged(window, judge is not None and bool(judge(first, obs["frames"])))
            sim_running = run_on or result.simulator.success_window is None
            if sim_running:
                truth_obs, *_ = truth.step(actions)
                sim_frames = truth_obs["frames"]
                if on_truth is not None:
                    on_truth(sim_frames)
                result.simulator.judged(window, judge is not None and bool(judge(first, sim_frames)))
                result.psnr_db.append(float(psnr(obs["frames"], sim_frames).mean()))
            if writer is not None:
                held = np.broadcast_to(sim_frames[-1:], obs["frames"].shape)
                note = "" if sim_running else f"simulator done at window {result.simulator.success_window}"
                caption = _caption(window, result.psnr_db[-1] if sim_running else None, note)
                writer.write(side_by_side(obs["frames"], held if not sim_running else sim_frames, scale,
                                          labels=labels, caption=caption))
            bar.update(1)
            if on_window is not None:
                on_window()
            model_done = not run_on and result.model.success_window is not None
            if model_done or terminated or truncated:
                result.model.ended = "success" if model_done else ("terminated" if terminated else "truncated")
                break
    sim_stopped = not run_on and result.simulator.success_window is not None
    result.simulator.ended = "success" if sim_stopped else result.model.ended
    episode.terminated = result.model.ended in ("success", "terminated")
    episode.truncated = result.model.ended == "truncated"
    episode.success = result.simulator.final_success
    episode.finish(start)
    return result
