"""A gymnasium env whose step runs one window of an action-conditioned video world model."""

from __future__ import annotations

import copy
import difflib
from collections.abc import Callable
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from worldstep.engine.kv import KVPoolExhausted
from worldstep.engine.models.cosmos3 import RolloutKnobs, SessionClosedError

from .checks import check_actions, check_callable, check_image, check_int, check_prompt
from .scene import SimulatorScene, draw_tabletop

RESET_OPTION_KEYS = ("image", "prompt", "domain_id")
SUCCESS_MODES = ("sim", "none")


class WorldModelEnv(gym.Env[dict[str, np.ndarray], np.ndarray]):
    """
    ## Description

    An action-conditioned video world model (NVIDIA Cosmos3-Edge) driven like a simulator. A reset opens a
    rollout session from a first frame, a text prompt and an embodiment ``domain_id``: the prompt is
    prefilled once into protected KV pages and the first frame is encoded as the clean latent frame 0.
    Each ``step(actions)`` generates one window of ``chunk_size`` frames conditioned on ``chunk_size``
    actions: the window is denoised against the paged KV cache of the prompt and the committed past
    windows, committed into the cache (windows older than ``context_frames`` slide out), and decoded by
    a warm streaming VAE decoder into the frames returned as the observation.

    ## Action Space

    The action is a ``ndarray`` with shape ``(chunk_size, action_width)``, dtype float32, values in
    ``[-1, 1]``: one row per frame of the window, the embodiment's normalised action vector. Row ``i``
    drives frame ``i`` of the window. ``action_width`` is at most the model's ``action_dim`` (64 for
    Cosmos3-Edge); the model zero-pads the remaining dimensions.

    ## Observation Space

    The observation is a ``dict``:

    | Key    | Observation                      | Shape                      | Dtype | Min | Max |
    |--------|----------------------------------|----------------------------|-------|-----|-----|
    | frames | the window's decoded RGB frames  | (chunk_size, H, W, 3)      | uint8 | 0   | 255 |

    After ``reset``, ``frames`` holds the model's decoded first frame (the VAE round trip of the given
    image) repeated ``chunk_size`` times, so every observation has the same shape. The frames play at
    ``metadata["frame_fps"]`` (the model's fps); ``render()`` returns one frame per window, so
    ``metadata["render_fps"]`` is ``frame_fps / chunk_size`` (what ``gymnasium.wrappers.RecordVideo`` needs).

    ## Rewards

    A world model predicts frames, not rewards. The reward is ``reward_fn(frames, actions)`` when one is
    given, otherwise 1.0 for a window the success judge calls successful and 0.0 else.

    ## Starting State

    The first frame is ``options["image"]`` of ``reset``, else the constructor's ``image``, else the first
    frame of ``simulator`` reset with the same seed (``info["scene_seed"]``), else a tabletop scene (a blue
    block and a red end-effector) drawn from ``self.np_random``. The diffusion
    noise of every window comes from a ``torch.Generator`` seeded from ``self.np_random`` at reset, so
    the same seed and the same actions give the same frames.

    ## Episode End

    The episode ends if any one of the following occurs:

    1. Termination: the success judge calls the window successful (``info["is_success"]``).
    2. Truncation: ``max_windows`` windows have been generated.
    3. Truncation: the KV page pool cannot hold the next window (``info["kv_exhausted"]``); the session
       is closed and its pages returned, the observation repeats the last frames. Reset to continue.

    ## Arguments

    - ``model``: a loaded ``Cosmos3WorldModel`` (``worldstep.load(...).model``); envs share it. Its page pool
      must hold one episode's prompt, first frame and first window (else ``ValueError`` naming
      ``cache.num_pages`` and the minimum).
    - ``knobs``: ``RolloutKnobs`` (chunk_size, num_steps, guidance_scale, context_frames, window_mode, ...).
    - ``max_windows``: windows per episode before truncation.
    - ``prompt``, ``domain_id``, ``image``: defaults of the reset options of the same names (an option that
      is missing or None takes its default; an unknown option key raises ``ValueError``).
    - ``action_width``: action dimensions the policy controls (default: the model's ``action_dim``).
    - ``simulator``: gymnasium id of the ground-truth simulator the model was trained on (e.g.
      ``"worldstep/PushSim-v0"``); resets without an image start from its first frame for the same seed.
    - ``success_fn``: the success judge. ``frames -> bool``; ``"sim"``: the simulator's pixel judge
      (``success_from_frames(first_frame, frames)``, goal read from the episode's first frame); ``"none"``:
      never successful; None (default): ``"sim"`` when ``simulator`` has a judge, else ``"none"``.
    - ``reward_fn``: see Rewards.
    - ``render_mode``: ``"rgb_array"`` (``render()`` returns the latest frame) or None.

    ```python
    >>> import gymnasium as gym, worldstep
    >>> env = gym.make("worldstep/Tiny-v0")
    >>> obs, info = env.reset(seed=0, options={"prompt": "pick up the red cube", "domain_id": 8})
    >>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    ```

    ## Version History

    * v0: Initial version: windowed KV rollout of Cosmos3 forward dynamics.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 6, "frame_fps": 24}

    def __init__(
        self,
        model,
        knobs: RolloutKnobs | None = None,
        *,
        max_windows: int = 32,
        prompt: str = "A robot arm pushes a block across a table.",
        domain_id: int = 0,
        image: np.ndarray | None = None,
        action_width: int | None = None,
        simulator: str | None = None,
        reward_fn: Callable[[np.ndarray, np.ndarray], float] | None = None,
        success_fn: Callable[[np.ndarray], bool] | Literal["sim", "none"] | None = None,
        render_mode: str | None = None,
    ) -> None:
        if not hasattr(model, "open_session") or not hasattr(model, "spec"):
            raise TypeError(f"model={model!r} is invalid; allowed: a loaded Cosmos3WorldModel")
        knobs = RolloutKnobs() if knobs is None else knobs
        if not isinstance(knobs, RolloutKnobs) or not knobs.decode:
            raise ValueError(f"knobs={knobs!r} is invalid; allowed: RolloutKnobs with decode=True")
        spec = model.spec
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r} is invalid; allowed: None or 'rgb_array'")
        self.model = model
        self.knobs = knobs
        self.max_windows = check_int("max_windows", max_windows, 1)
        self.prompt = check_prompt("prompt", prompt)
        self.domain_id = check_int("domain_id", domain_id, 0, spec.num_domains)
        self.image = None if image is None else check_image("image", image)
        width = spec.action_dim if action_width is None else action_width
        self.action_width = check_int("action_width", width, 1, spec.action_dim + 1)
        self._check_pool(self.prompt, "prompt")
        self.simulator = simulator
        self._scene = None if simulator is None else SimulatorScene(simulator)
        self.reward_fn = check_callable("reward_fn", reward_fn)
        self.success_fn, self._simulator_judge = self._resolve_success(success_fn)
        self.render_mode = render_mode
        self.metadata = {**type(self).metadata, "render_fps": spec.fps / knobs.chunk_size, "frame_fps": spec.fps}

        chunk, height, width_px = knobs.chunk_size, spec.height, spec.width
        self.action_space = spaces.Box(-1.0, 1.0, (chunk, self.action_width), np.float32)
        self.observation_space = spaces.Dict(
            {"frames": spaces.Box(0, 255, (chunk, height, width_px, 3), np.uint8)}
        )

        self._session = None  # the engine RolloutSession of the current episode
        self._frames: np.ndarray | None = None  # the last observation's frames
        self._first_image: np.ndarray | None = None  # the episode's first frame (the simulator judge's goal)
        self._windows = 0  # windows generated this episode
        self._closed = False  # close() was called and no reset since

    # --- gymnasium API ---------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        image, prompt, domain_id = self._check_options(options)
        super().reset(seed=seed)
        scene_seed = None
        if image is None and self._scene is not None:
            image, scene_seed = self._scene(seed, self.np_random)
            image = check_image(f"first frame of simulator {self.simulator!r}", image)
        elif image is None:
            image = draw_tabletop(self.model.spec.height, self.model.spec.width, self.np_random)
        generator = torch.Generator().manual_seed(int(self.np_random.integers(2**63)))
        self._close_session()  # options are valid: free the old episode's pages before opening the new one
        session = self.model.open_session(image, prompt, domain_id, knobs=self.knobs, generator=generator)
        self._session, self._windows, self._closed = session, 0, False
        self._first_image = image
        self._frames = np.repeat(session.first_frame[None], self.knobs.chunk_size, axis=0)
        info = {"frame_start": 0, "frame_end": 1, "kv": session.kv_stats()}
        if scene_seed is not None:
            info["scene_seed"] = scene_seed
        return self._obs(), info

    def step(self, actions: np.ndarray):
        actions, session = self._begin_step(actions)
        try:
            result = session.step(actions)  # the local: close() from another thread cannot swap it to None
        except KVPoolExhausted:
            return self._exhausted_step()
        except SessionClosedError as err:
            raise gym.error.ClosedEnvironmentError(
                "the env was closed while env.step() ran; call env.reset() to start a new episode") from err
        return self._finish_step(result, actions)

    def render(self) -> np.ndarray | None:
        if self.render_mode is None:
            gym.logger.warn(
                "You are calling render method without specifying any render mode. "
                'You can specify the render_mode at initialization, e.g. gym.make("worldstep/Tiny-v0", render_mode="rgb_array")'
            )
            return None
        if self._frames is None:
            return None
        return self._frames[-1].copy()

    def close(self) -> None:
        """Close the session: every KV page and decoder cache it held goes back. Safe to call twice."""
        self._closed = True
        self._close_session()
        self._frames = None
        if self._scene is not None:
            self._scene.close()
        super().close()

    # --- beyond gymnasium ------------------------------------------------------------------

    def fork(self, seed: int | None = None) -> WorldModelEnv:
        """An independent env continuing from this env's current state.

        The engine session forks (committed KV pages shared by reference, decoder cache copied) and the
        env's RNG is copied, so the fork and this env step identically given the same actions. With
        ``seed`` the fork's RNG and diffusion noise are reseeded instead, to sample a different future.
        The fork is unwrapped; ``worldstep.envs.fork_env(env)`` forks an env made by ``gym.make`` and
        keeps its wrappers.
        """
        session = self._session
        if session is None or session.closed:
            raise gym.error.ResetNeeded("Cannot fork an env without a live episode; call reset() first.")
        other = copy.copy(self)
        other.action_space = copy.deepcopy(self.action_space)  # spaces carry their own sampling RNG
        other.observation_space = copy.deepcopy(self.observation_space)
        other._scene = None if self.simulator is None else SimulatorScene(self.simulator)  # closed with the fork
        if seed is None:
            other.np_random = copy.deepcopy(self.np_random)
            generator = None  # the engine copies this session's generator state
        else:
            other.np_random, _ = gym.utils.seeding.np_random(seed)
            generator = torch.Generator().manual_seed(int(other.np_random.integers(2**63)))
        other._session = session.fork(generator=generator)
        other._frames = self._frames.copy()
        return other

    @property
    def windows(self) -> int:
        """Windows generated in the current episode."""
        return self._windows

    # --- steps in two halves (the vector env batches the engine call between them) ----------

    def _begin_step(self, actions):
        """(checked actions, the episode's session): the session is read once, so a concurrent close()
        makes the engine call fail cleanly instead of finding None."""
        actions = check_actions(actions, self.action_space.shape)
        session = self._session
        if session is None or session.closed:
            if self._closed:
                raise gym.error.ClosedEnvironmentError(
                    "Cannot call env.step() after env.close(); call env.reset() to start a new episode")
            raise gym.error.ResetNeeded("Cannot call env.step() before calling env.reset()")
        return actions, session

    def _finish_step(self, result, actions: np.ndarray):
        self._windows += 1
        self._frames = result.frames
        is_success = self._is_success(result.frames)
        if self.reward_fn is not None:
            reward = float(self.reward_fn(result.frames, actions))
        else:
            reward = float(is_success)
        info = {
            "window_index": result.window_index,
            "frame_start": result.frame_start,
            "frame_end": result.frame_end,
            "timings": result.timings,
            "kv": result.kv,
            "is_success": is_success,
            "kv_exhausted": False,
        }
        return self._obs(), reward, is_success, self._windows >= self.max_windows, info

    def _exhausted_step(self):
        """The pool could not hold the window: the engine closed the session; end the episode by truncation."""
        self._close_session()
        info = {"window_index": self._windows, "is_success": False, "kv_exhausted": True}
        return self._obs(), 0.0, False, True, info

    # --- helpers ---------------------------------------------------------------------------

    def _resolve_success(self, success_fn) -> tuple[Callable | None, Callable | None]:
        """(user judge ``frames -> bool``, simulator judge ``(first_frame, frames) -> bool``); one is None."""
        if success_fn is None:
            success_fn = "sim" if self._scene is not None and self._scene.success_judge() is not None else "none"
        if isinstance(success_fn, str):
            if success_fn not in SUCCESS_MODES:
                raise ValueError(f"success_fn={success_fn!r} is invalid; allowed: a callable frames -> bool, "
                                 f"'sim' or 'none'")
            if success_fn == "none":
                return None, None
            judge = None if self._scene is None else self._scene.success_judge()
            if judge is None:
                raise ValueError(f"success_fn='sim' is invalid with simulator={self.simulator!r}; allowed: a "
                                 "simulator with success_from_frames (e.g. 'worldstep/PushSim-v0')")
            return None, judge
        return check_callable("success_fn", success_fn), None

    def _is_success(self, frames: np.ndarray) -> bool:
        if self._simulator_judge is not None:
            return bool(self._simulator_judge(self._first_image, frames))
        return bool(self.success_fn(frames)) if self.success_fn is not None else False

    def _check_pool(self, prompt: str, field: str) -> None:
        """ValueError when the page pool cannot hold one episode's prompt, first frame and first window."""
        needed = self.model.min_pages(prompt, self.knobs)
        pool = self.model.kv.allocator.num_pages
        if needed > pool:
            raise ValueError(
                f"cache.num_pages={pool} is invalid for {field} of {len(prompt)} characters; allowed: >= {needed} "
                f"(the prompt, first frame and first window of one episode, {self.model.kv.page_size} tokens "
                "per page)")

    def _check_options(self, options: dict[str, Any] | None) -> tuple[np.ndarray | None, str, int]:
        """Reset options over the constructor defaults (a missing or None key takes the default; an unknown
        key raises, naming the allowed keys)."""
        if options is not None and not isinstance(options, dict):
            raise ValueError(f"options={options!r} is invalid; allowed: a dict with keys {RESET_OPTION_KEYS}")
        for key in options or {}:
            if key not in RESET_OPTION_KEYS:
                near = difflib.get_close_matches(str(key), RESET_OPTION_KEYS, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise ValueError(f"options[{key!r}] is invalid: unknown reset option{hint}; allowed keys: "
                                 f"{', '.join(RESET_OPTION_KEYS)}")
        given = {k: v for k, v in (options or {}).items() if v is not None}
        image = given.get("image", self.image)
        image = None if image is None else check_image("options['image']", image)
        prompt = check_prompt("options['prompt']", given.get("prompt", self.prompt))
        domain_id = check_int("options['domain_id']", given.get("domain_id", self.domain_id), 0,
                              self.model.spec.num_domains)
        if prompt != self.prompt:
            self._check_pool(prompt, "options['prompt']")
        return image, prompt, domain_id

    def _obs(self) -> dict[str, np.ndarray]:
        return {"frames": self._frames.copy()}

    def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()
