"""A LeRobot-shaped env over a ``worldstep serve`` session: ``lerobot-eval`` runs LeRobot policies in the model.

LeRobot steps one action at a time; a world-model window takes a chunk of ``chunk_size`` actions. This env gathers
the policy's actions and runs ONE window when a chunk is full; the steps in between return the last generated
frame again (held), and say so in ``info["fresh"]``. Actions arrive in the units of the LeRobot dataset the policy
was trained on and reach the model through worldstep's ``ActionNormalizer`` with that dataset's
``meta/stats.json``. Success is the server's judge (``JudgeSuccess``), reported where LeRobot reads it,
``info["is_success"]`` (``final_info`` of the vector env). It imports no torch and no diffusers of worldstep's: it
runs in LeRobot's own venv (``worldstep.lerobot_plugin`` registers it with LeRobot; docs/lerobot.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from worldstep.engine.embodiment.action_normalizer import ActionNormalizer
from worldstep.engine.embodiment.action_stats import ActionStats
from worldstep.envs.cameras import CameraGrid
from worldstep.serve.client import RemoteWorldModelEnv

ROBOT_STATES = ("none", "zeros", "last_action")
NORMALIZATIONS = ("quantile", "meanstd", "none")


@dataclass(frozen=True)
class PolicyEnvOptions:
    """What ``LeRobotPolicyEnv`` serves a policy (the ``--env.*`` fields of LeRobot's ``worldstep`` env type).

    Attributes:
        cameras: LeRobot camera names (``observation.images.<name>``) the model frame is split into, in order.
        camera_layout: ``row`` or ``column``, how the views sit in the frame (``worldstep.envs.cameras``).
        robot_state: ``agent_pos`` (LeRobot's ``observation.state``): ``none`` (no key), ``zeros`` or
            ``last_action`` (the last action given, in dataset units; zeros after a reset), action-wide.
        stats: a LeRobot dataset folder (its ``meta/stats.json``) or a stats JSON file; its ``action`` block maps
            the policy's actions to the model's. None: the actions go to the model unchanged.
        normalization: the embodiment's normalisation with ``stats``: ``quantile``, ``meanstd`` or ``none``.
        max_windows, task, embodiment: the served env's (None: the server's config); ``task`` is its prompt.
        timeout_s, reconnect_s: the client's (``RemoteWorldModelEnv``).
        record: a folder that gets one ``seed_<seed>.npz`` per finished seeded episode (its first frame and scene
            seed, every window's frames, the actions as given and as sent, the judge's verdict per window).
        image: an image file (PNG, JPEG) every episode starts from, sent to the server (None: the server's start,
            e.g. its simulator's scene for the seed).
    """

    cameras: tuple[str, ...] = ("top",)
    camera_layout: str = "row"
    robot_state: str = "none"
    stats: str | None = None
    normalization: str = "quantile"
    max_windows: int | None = None
    task: str | None = None
    embodiment: str | None = None
    timeout_s: float = 120.0
    reconnect_s: float = 30.0
    record: str | None = None
    image: str | None = None

    def __post_init__(self) -> None:
        if self.image is not None and not Path(self.image).is_file():
            raise ValueError(f"image={self.image!r} is invalid; allowed: None or an image file that exists")
        if self.robot_state not in ROBOT_STATES:
            raise ValueError(f"robot_state={self.robot_state!r} is invalid; allowed: {', '.join(ROBOT_STATES)}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization={self.normalization!r} is invalid; allowed: "
                             f"{', '.join(NORMALIZATIONS)}")

    def normalizer(self, width: int) -> ActionNormalizer | None:
        """The dataset-units -> model-units stage, or None without stats."""
        if self.stats is None:
            return None
        path = Path(self.stats)
        path = path / "meta" / "stats.json" if path.is_dir() else path
        return ActionNormalizer(self.normalization, ActionStats.from_json(path, key="action"), width=width)

    def served(self) -> dict[str, Any]:
        """The served env's keywords."""
        given = {"max_windows": self.max_windows, "prompt": self.task, "embodiment": self.embodiment,
                 "image": None if self.image is None else start_image(self.image)}
        return {k: v for k, v in given.items() if v is not None}


def start_image(path: str) -> np.ndarray:
    """``[H, W, 3]`` uint8 RGB of an image file (Pillow: LeRobot's venv has it; no torch)."""
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def served_actions(raw: np.ndarray, normalizer: ActionNormalizer | None) -> tuple[np.ndarray, int]:
    """A chunk of dataset-unit actions ``[chunk, A]`` -> the model's values, and how many were clipped: normalised
    with the dataset's stats, then clipped to [-1, 1], the range a served env takes (its raw-action wrapper is
    not served)."""
    model = raw if normalizer is None else normalizer(raw).actions
    sent = np.clip(model, -1.0, 1.0).astype(np.float32)
    return sent, int(np.count_nonzero(sent != model))


class LeRobotPolicyEnv(gym.Env[dict[str, Any], np.ndarray]):
    """
    ## Description
    One LeRobot policy step per ``step``: ``chunk_size`` steps make one window of a ``worldstep serve`` session.

    ## Action Space
    ``Box(action_width,)`` float32 in the LeRobot dataset's units (the stats' range; unbounded without stats).

    ## Observation Space
    | Key               | Observation                                   | Shape             | Dtype   |
    |-------------------|-----------------------------------------------|-------------------|---------|
    | pixels[<camera>]  | the camera's view of the latest frame         | (h, w, 3)         | uint8   |
    | agent_pos         | with ``robot_state`` zeros or last_action     | (action_width,)   | float32 |

    The latest frame is the last of the last window (after ``reset``, the model's first frame); steps that only
    gather actions return it again (``info["fresh"]`` False).

    ## Rewards
    The served judge's reward of the window, on the step that runs it; 0.0 on the steps in between.

    ## Starting State
    The served env's reset with the given seed (its first frame; ``info["scene_seed"]`` when a simulator drew it).

    ## Episode End
    Termination: the served judge calls a window a success (``info["is_success"]``). Truncation: the served
    window limit (``max_windows``). ``_max_episode_steps`` is ``max_windows * chunk_size``.

    ## Arguments
    ``url``, ``token`` (or None), ``options`` (``PolicyEnvOptions``), ``render_mode`` (``rgb_array``), ``expect``:
    ``(frame_height, frame_width, action_width)`` the policy was built for (a ValueError when the server differs).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 24}

    def __init__(self, url: str, token: str | None = None, options: PolicyEnvOptions | None = None,
                 render_mode: str | None = "rgb_array", expect: tuple[int, int, int] | None = None) -> None:
        options = PolicyEnvOptions() if options is None else options
        if not isinstance(options, PolicyEnvOptions):
            raise ValueError(f"options of type {type(options).__name__} are invalid; allowed: PolicyEnvOptions")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode={render_mode!r} is invalid; allowed: None or 'rgb_array'")
        # a server that is down raises RemoteEnvConnectionError here, naming the url: LeRobot stops with it
        self.remote = RemoteWorldModelEnv(url, token, timeout_s=options.timeout_s, reconnect_s=options.reconnect_s,
                                          **options.served())
        try:
            self._setup(options, render_mode)
            self._check_served(expect)
        except BaseException:
            self.remote.close()
            raise

    def _setup(self, options: PolicyEnvOptions, render_mode: str | None) -> None:
        self.options, self.render_mode = options, render_mode
        self.chunk, width = self.remote.action_space.shape
        _, height, frame_width, _ = self.remote.observation_space["frames"].shape
        self.grid = CameraGrid(tuple(options.cameras), options.camera_layout, height, frame_width)
        self.normalizer = options.normalizer(width)
        bounds = None if self.normalizer is None else self.normalizer.range()
        low, high = (-np.inf, np.inf) if bounds is None else bounds
        self.action_space = spaces.Box(np.broadcast_to(low, (width,)).astype(np.float32),
                                       np.broadcast_to(high, (width,)).astype(np.float32), (width,), np.float32)
        views = {name: spaces.Box(0, 255, (h, w, 3), np.uint8) for name, (h, w) in self.grid.view_shapes().items()}
        observation = {"pixels": spaces.Dict(views)}
        if options.robot_state != "none":
            observation["agent_pos"] = spaces.Box(-np.inf, np.inf, (width,), np.float32)
        self.observation_space = spaces.Dict(observation)
        self.metadata = {**type(self).metadata, "render_fps": self.remote.metadata["frame_fps"]}
        self.task = self.task_description = self.remote.prompt  # LeRobot's language instruction (add_envs_task)
        self._max_episode_steps = self.remote.max_windows * self.chunk
        self._live = False

    def _check_served(self, expect: tuple[int, int, int] | None) -> None:
        """The policy's features were fixed before connecting (LeRobot's env config): the server must match."""
        served = (self.grid.height, self.grid.width, self.action_space.shape[0])
        if expect is not None and tuple(expect) != served:
            names = ("frame_height", "frame_width", "action_width")
            wrong = [f"{n}={e}" for n, e, s in zip(names, expect, served) if e != s]
            raise ValueError(f"{', '.join(wrong)} is invalid for the model served at {self.remote.url}; allowed: "
                             f"frame_height={served[0]}, frame_width={served[1]}, action_width={served[2]}")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        obs, info = self.remote.reset(seed=seed, options=options)
        self._frame = obs["frames"][-1]
        self._gathered: list[np.ndarray] = []
        self._last_action = np.zeros(self.action_space.shape, np.float32)
        self._record = {"seed": seed, "scene_seed": info.get("scene_seed", -1), "first": obs["frames"][0],
                        "frames": [], "raw": [], "sent": [], "success": []}
        self._live = True
        return self._observation(), {"is_success": False, "fresh": True}

    def step(self, action: np.ndarray):
        if not self._live:
            raise gym.error.ResetNeeded("Cannot call env.step() before env.reset() or after the episode ended")
        action = np.asarray(action, dtype=np.float32)
        if action.shape != self.action_space.shape or not np.isfinite(action).all():
            raise ValueError(f"action of shape {action.shape} is invalid; allowed: {self.action_space.shape} finite "
                             "values in the dataset's units")
        self._gathered.append(action)
        self._last_action = action
        if len(self._gathered) < self.chunk:  # the window waits for its chunk: the frame is held
            return self._observation(), 0.0, False, False, {"is_success": False, "fresh": False}
        raw = np.stack(self._gathered)  # [chunk, A]
        self._gathered = []
        sent, clipped = served_actions(raw, self.normalizer)
        obs, reward, terminated, truncated, info = self.remote.step(sent)
        self._frame = obs["frames"][-1]
        success = bool(info.get("is_success", False))
        for key, value in (("frames", obs["frames"]), ("raw", raw), ("sent", sent), ("success", success)):
            self._record[key].append(value)
        if terminated or truncated:
            self._live = False
            self._save_record()
        return self._observation(), float(reward), bool(terminated), bool(truncated), {
            "is_success": success, "fresh": True, "actions_clipped": clipped}

    def _observation(self) -> dict[str, Any]:
        obs: dict[str, Any] = {"pixels": self.grid.split(self._frame)}
        if self.options.robot_state == "zeros":
            obs["agent_pos"] = np.zeros(self.action_space.shape, np.float32)
        elif self.options.robot_state == "last_action":
            obs["agent_pos"] = self._last_action.copy()
        return obs

    def _save_record(self) -> None:
        if self.options.record is None or self._record["seed"] is None:
            return
        folder = Path(self.options.record)
        folder.mkdir(parents=True, exist_ok=True)
        r = self._record
        np.savez(folder / f"seed_{r['seed']}.npz", scene_seed=np.array(r["scene_seed"]), first=r["first"],
                 frames=np.stack(r["frames"]), raw=np.stack(r["raw"]), sent=np.stack(r["sent"]),
                 success=np.array(r["success"]))

    def render(self) -> np.ndarray | None:
        return None if self.render_mode is None else self._frame.copy()

    def close(self) -> None:
        self.remote.close()
