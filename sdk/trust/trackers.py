"""A task's tracker: how far a window's frames depart from what the commanded actions do to what the model's own
previous frame showed (the `consistency` signal). A world model that drifts moves the block without a push, or
loses it; the tracker steps the detected objects by the simulator's own rules and measures the gap."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Tracker(Protocol):
    """`residual(previous_frame, frames, actions)` -> px (None: nothing to measure, e.g. no object in view)."""

    def residual(self, previous_frame: np.ndarray, frames: np.ndarray, actions: np.ndarray) -> float | None: ...


class PushTracker:
    """PushSim's tracker: the effector and block detected in the model's previous frame, stepped through the
    window's actions by `physics_step`, against the block detected in the window's last frame. The residual
    is the block's distance in px; a block that was in view and is lost is `inf`."""

    def residual(self, previous_frame: np.ndarray, frames: np.ndarray, actions: np.ndarray) -> float | None:
        from worldstep.envs.push_sim import PushState, detect_objects, physics_step

        before = detect_objects(previous_frame)
        if before["effector"] is None or before["block"] is None:
            return None
        goal = before["goal"] if before["goal"] is not None else np.zeros(2)
        state = PushState(np.asarray(before["effector"], float), np.asarray(before["block"], float), goal)
        for action in np.asarray(actions, dtype=np.float64):
            state = physics_step(state, action)
        block = detect_objects(np.asarray(frames)[-1])["block"]
        return float("inf") if block is None else float(np.linalg.norm(np.asarray(block) - state.block))
