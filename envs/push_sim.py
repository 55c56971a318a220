"""A 2-D pusher simulator: the ground truth that worldstep's `pusher` world model is trained on and judged by.

Frames are rendered here and read back by `detect_objects` / `frame_success`, the *same* colour-centroid
detector used on world-model frames, so success in the simulator and success in the world model are
judged by one rule from pixels alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from worldstep.engine.checks import check_int

SIZE = 64  # frame height = width in pixels
EFFECTOR = 8.0  # effector side (px)
BLOCK = 12.0  # block side (px)
GOAL = 20.0  # goal ring outer side (px); ring 2 px thick, inner 16 px > block
RING = 2.0
SPEED = 3.0  # px per step at |action| = 1
SUCCESS_RADIUS = 4.0  # block centre within this many px of the goal centre (each axis)

BACKGROUND = np.array([24, 24, 30], dtype=np.float32)
RED = np.array([230, 50, 40], dtype=np.float32)  # effector
BLUE = np.array([40, 90, 235], dtype=np.float32)  # block
GREEN = np.array([40, 200, 70], dtype=np.float32)  # goal ring


@dataclass(frozen=True)
class PushState:
    """True positions (x = column, y = row, pixel units, object centres)."""

    effector: np.ndarray  # [2]
    block: np.ndarray  # [2]
    goal: np.ndarray  # [2]

    @property
    def success(self) -> bool:
        return bool(np.all(np.abs(self.block - self.goal) <= SUCCESS_RADIUS))


# --- rendering -------------------------------------------------------------------------------------


def _coverage(center: np.ndarray, side: float) -> np.ndarray:
    """[SIZE, SIZE] fraction of each pixel covered by an axis-aligned square (soft, exact box filter)."""
    lo, hi = center - side / 2, center + side / 2
    pix = np.arange(SIZE, dtype=np.float64)
    cov_x = np.clip(np.minimum(pix + 1, hi[0]) - np.maximum(pix, lo[0]), 0, 1)  # [W]
    cov_y = np.clip(np.minimum(pix + 1, hi[1]) - np.maximum(pix, lo[1]), 0, 1)  # [H]
    return np.outer(cov_y, cov_x)  # [H, W]


FRAME_FPS = 24  # frames per second of an observation's frames (one per action)
# The embodiment of a world model of this simulator (worldstep.train writes it into the checkpoint's
# worldstep.json): its raw 2-D velocity actions at its frame rate, unnormalised, as domain 0 of the model's own.
PUSHER_EMBODIMENT = {"name": "pusher", "domain_id": 0, "raw_width": 2, "fps": float(FRAME_FPS),
                     "view_point": "ego_view", "normalization": "none"}


def render_state(state: PushState) -> np.ndarray:
    """`[SIZE, SIZE, 3]` uint8 frame: goal ring, then block, then effector painted over a dark table."""
    frame = np.broadcast_to(BACKGROUND, (SIZE, SIZE, 3)).astype(np.float32)
    ring = _coverage(state.goal, GOAL) - _coverage(state.goal, GOAL - 2 * RING)
    for alpha, colour in ((ring, GREEN), (_coverage(state.block, BLOCK), BLUE),
                          (_coverage(state.effector, EFFECTOR), RED)):
        a = alpha[..., None].astype(np.float32)
        frame = frame * (1 - a) + colour * a
    return np.clip(np.rint(frame), 0, 255).astype(np.uint8)


# --- detection (shared by simulator and world-model frames) ----------------------------------------


def _centroid(score: np.ndarray, threshold: float) -> np.ndarray | None:
    weight = np.clip(score - threshold, 0, None)
    total = weight.sum()
    if total < 1e-6 * SIZE * SIZE or (score > threshold).sum() < 3:
        return None
    rows, cols = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64)
    # +0.5: centroid in the same continuous coordinates as PushState (pixel i spans [i, i+1)).
    return np.array([(weight * cols).sum() / total + 0.5, (weight * rows).sum() / total + 0.5])


def detect_objects(frame: np.ndarray) -> dict[str, np.ndarray | None]:
    """Colour-centroid detector: `{"effector", "block", "goal"}` -> (x, y) or None when not visible.

    A pixel belongs to a colour by how much its dominant channel exceeds the other two
    (`R - max(G, B)` for the effector, etc.), thresholded at 60 and weighted by the excess, so
    blurred world-model blobs still give a centroid and a dark table gives none. It is used, unchanged,
    on simulator frames and on world-model frames.
    """
    f = np.asarray(frame, dtype=np.float32)
    r, g, b = f[..., 0], f[..., 1], f[..., 2]
    return {
        "effector": _centroid(r - np.maximum(g, b), 60.0),
        "block": _centroid(b - np.maximum(r, g), 60.0),
        "goal": _centroid(g - np.maximum(r, b), 60.0),
    }


def frame_success(frame: np.ndarray, goal: np.ndarray | None = None) -> bool:
    """Success read from pixels: the detected block centre lies within `SUCCESS_RADIUS` px of the goal.

    The goal centre is taken from `goal` when given (it is static, so evaluators pass the one seen
    in the episode's first frame, which keeps a blurred ring from moving the goalposts); otherwise
    it is detected in `frame`.
    """
    found = detect_objects(frame)
    block = found["block"]
    goal = goal if goal is not None else found["goal"]
    if block is None or goal is None:
        return False
    return bool(np.all(np.abs(block - np.asarray(goal)) <= SUCCESS_RADIUS + 0.5))


# --- dynamics --------------------------------------------------------------------------------------


def _clamp(pos: np.ndarray, side: float) -> np.ndarray:
    return np.clip(pos, side / 2, SIZE - side / 2)


def physics_step(state: PushState, action: np.ndarray) -> PushState:
    """Move the effector by `SPEED * action`; an overlapping block is pushed out along the axis of
    least penetration; walls stop both (a block stuck at a wall stops the effector)."""
    effector = _clamp(state.effector + SPEED * np.clip(action, -1, 1), EFFECTOR)
    block = state.block.copy()
    gap = (EFFECTOR + BLOCK) / 2
    delta = block - effector
    overlap = gap - np.abs(delta)
    if np.all(overlap > 0):
        axis = int(np.argmin(overlap))
        direction = 1.0 if delta[axis] >= 0 else -1.0
        block[axis] += direction * overlap[axis]
        block = _clamp(block, BLOCK)
        effector[axis] = block[axis] - direction * gap  # stopped by the block at a wall
        effector = _clamp(effector, EFFECTOR)
    return PushState(effector, block, state.goal.copy())


def push_oracle(state: PushState) -> np.ndarray:
    """A scripted expert: line up behind the block on one axis, push it there, then the other axis."""
    e, b, g = state.effector, state.block, state.goal
    gap = (EFFECTOR + BLOCK) / 2
    for axis in (0, 1):
        d = g[axis] - b[axis]
        if abs(d) <= 1.5:
            continue
        s = 1.0 if d > 0 else -1.0
        other = 1 - axis
        behind = b.copy()
        behind[axis] = b[axis] - s * (gap + 1.0)
        on_wrong_side = s * (e[axis] - b[axis]) > -gap
        blocking = abs(e[other] - b[other]) < gap + 1.0
        if on_wrong_side and blocking:  # go around the block first
            side = 1.0 if e[other] >= b[other] else -1.0
            if b[other] + side * (gap + 2) > SIZE - EFFECTOR / 2 or b[other] + side * (gap + 2) < EFFECTOR / 2:
                side = -side
            target = e.copy()
            target[other] = b[other] + side * (gap + 2.5)
            target[axis] = e[axis] - s * 1.0
        elif np.abs(e - behind).max() > 1.5:
            target = behind
        else:
            action = np.zeros(2)
            action[axis] = s * min(1.0, abs(d) / SPEED + 0.2)
            action[other] = np.clip((b[other] - e[other]) / SPEED, -1, 1)
            return action.astype(np.float32)
        return np.clip((target - e) / SPEED, -1, 1).astype(np.float32)
    return np.zeros(2, dtype=np.float32)


# --- starts ----------------------------------------------------------------------------------------


def sample_start(rng: np.random.Generator) -> PushState:
    """A random start (see `PushSimEnv` Starting State); all randomness from `rng`."""
    goal = rng.uniform(12, 52, size=2)
    block = rng.uniform(14, 50, size=2)
    while np.abs(block - goal).max() < 18:
        block = rng.uniform(14, 50, size=2)
    effector = rng.uniform(6, 58, size=2)
    while (np.abs(effector - block).max() < (EFFECTOR + BLOCK) / 2 + 1
           or np.abs(effector - goal).max() < (EFFECTOR + GOAL) / 2 + 1):  # keeps the first frame's ring whole
        effector = rng.uniform(6, 58, size=2)
    return PushState(effector, block, goal)


def first_frame(rng: np.random.Generator) -> np.ndarray:
    """The first frame of a random episode: what a pusher world-model env should reset to
    (`WorldModelEnv` draws a generic tabletop unless given an image)."""
    return render_state(sample_start(rng))


# --- env -------------------------------------------------------------------------------------------


class PushSimEnv(gym.Env[dict[str, np.ndarray], np.ndarray]):
    """
    ## Description

    A 2-D pusher on a 64x64 table seen from above. A red square end-effector (8 px) moves by velocity
    actions and pushes a blue block (12 px) toward a green goal ring (20 px). Contacts resolve along
    the axis of least penetration; the table edges stop both objects. Rendering is soft-edged (exact
    pixel coverage), so positions are recoverable from pixels to sub-pixel precision. This is the
    ground-truth simulator behind the ``pusher`` world model: the same conventions as
    ``WorldModelEnv`` (chunked actions in, every frame of the chunk out), so one policy can drive both.

    ## Action Space

    ``ndarray`` of shape ``(chunk_size, 2)``, float32 in ``[-1, 1]``: row ``i`` is the effector
    velocity ``(dx, dy)`` for frame ``i`` of the chunk, times 3 px per step.

    ## Observation Space

    ``{"frames": Box(0, 255, (chunk_size, 64, 64, 3), uint8)}``: the frame after each action.

    | Num | Observation (in ``info``, not in pixels) | Min | Max |
    |-----|------------------------------------------|-----|-----|
    | 0   | effector centre (x, y) px                | 4   | 60  |
    | 1   | block centre (x, y) px                   | 6   | 58  |
    | 2   | goal centre (x, y) px                    | 12  | 52  |

    ## Rewards

    ``1.0`` on the step the block reaches the goal (true state), else ``0.0``. Reward comes from the
    simulator's state; a world model predicts frames, not rewards, so evaluators judge both with
    ``frame_success`` on frames.

    ## Starting State

    Goal centre uniform in ``[12, 52]^2``; block uniform in ``[14, 50]^2`` at least 18 px from the
    goal (Chebyshev); effector uniform in ``[6, 58]^2`` touching neither the block nor the goal ring (so the
    first frame shows the whole ring); all from ``self.np_random``.

    ## Episode End

    1. Termination: the block centre is within 4 px (each axis) of the goal centre after any step of the chunk.
    2. Truncation: none here; the step limit is the ``TimeLimit`` wrapper added by ``gym.make``.

    ## Arguments

    ``gym.make("worldstep/PushSim-v0", chunk_size=4, render_mode="rgb_array")``;
    ``chunk_size`` must be a positive multiple of 4 (the world model's temporal compression).

    ## Version History

    * v0: Initial version.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 6, "frame_fps": 24}

    def __init__(self, chunk_size: int = 4, render_mode: str | None = None) -> None:
        if check_int("chunk_size", chunk_size, 4) % 4:
            raise ValueError(f"chunk_size={chunk_size!r} is invalid; allowed: an int multiple of 4, >= 4")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r} is invalid; allowed: None or 'rgb_array'")
        self.chunk_size = chunk_size
        self.render_mode = render_mode
        # render() gives one frame per step (a chunk of frames), so a video of the renders plays in real time
        # at frame_fps / chunk_size, as for WorldModelEnv
        self.metadata = {**type(self).metadata, "render_fps": FRAME_FPS / chunk_size, "frame_fps": FRAME_FPS}
        self.action_space = spaces.Box(-1.0, 1.0, shape=(chunk_size, 2), dtype=np.float32)
        self.observation_space = spaces.Dict(
            {"frames": spaces.Box(0, 255, shape=(chunk_size, SIZE, SIZE, 3), dtype=np.uint8)}
        )
        self.state: PushState | None = None
        self._last_frame: np.ndarray | None = None

    def _info(self, states: list[PushState]) -> dict[str, Any]:
        last = states[-1]
        return {
            "effector": last.effector.copy(), "block": last.block.copy(), "goal": last.goal.copy(),
            "states": np.stack([np.stack([s.effector, s.block, s.goal]) for s in states]),  # [chunk, 3, 2]
            "success": last.success,
        }

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.state = sample_start(self.np_random)
        self._last_frame = render_state(self.state)
        frames = np.repeat(self._last_frame[None], self.chunk_size, axis=0)
        return {"frames": frames}, self._info([self.state] * self.chunk_size)

    def step(self, action: np.ndarray):
        if self.state is None:
            raise RuntimeError("step() called before reset(); call env.reset() first")
        action = np.asarray(action, dtype=np.float32)
        if action.shape != self.action_space.shape:
            raise ValueError(f"action shape {action.shape} is invalid; allowed: {self.action_space.shape}")
        states, frames, terminated = [], [], False
        for row in action:
            self.state = physics_step(self.state, row)
            terminated = terminated or self.state.success
            states.append(self.state)
            frames.append(render_state(self.state))
        self._last_frame = frames[-1]
        # truncation=False as the time limit is handled by the `TimeLimit` wrapper added during `make`
        return {"frames": np.stack(frames)}, float(terminated), terminated, False, self._info(states)

    @staticmethod
    def success_from_frames(first_frame: np.ndarray, frames: np.ndarray) -> bool:
        """`frame_success` on any of `frames` with the goal seen in the episode's `first_frame`: the pixel
        judge that scores simulator and world-model episodes alike."""
        goal = detect_objects(first_frame)["goal"]
        return any(frame_success(f, goal) for f in frames)

    def render(self) -> np.ndarray | None:
        if self.render_mode == "rgb_array":
            return None if self._last_frame is None else self._last_frame.copy()
        return None
