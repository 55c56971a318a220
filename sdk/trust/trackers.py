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
        from worldstep.envs.push_sim import detect_objects

        before = detect_objects(previous_frame)
        return block_residual(before["effector"], before["block"], detect_objects(np.asarray(frames)[-1])["block"],
                              actions)


def block_residual(effector, block, block_after, actions: np.ndarray) -> float | None:
    """px between `block_after` and where PushSim's rules put the block from (`effector`, `block`) through
    `actions`; None when either was not seen before, inf when the block is not seen after."""
    from worldstep.envs.push_sim import PushState, physics_step

    if effector is None or block is None:
        return None
    state = PushState(np.asarray(effector, float), np.asarray(block, float), np.zeros(2))
    for action in np.asarray(actions, dtype=np.float64):
        state = physics_step(state, action)
    return float("inf") if block_after is None else float(np.linalg.norm(np.asarray(block_after) - state.block))
