"""A gymnasium env whose step runs one window of an action-conditioned video world model."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from worldstep.engine.checks import check_image, check_prompt
from worldstep.engine.config import RolloutKnobs
from worldstep.engine.embodiment.conditioning import Conditioning
from worldstep.engine.models.cosmos3.first_frame import frame_for_size
from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel
from worldstep.engine.spec import ModelSpec
from worldstep.envs.episode import (
    ACTION_BOUNDS,
    OBSERVATIONS,
    Episode,
    EpisodeRules,
    check_pool,
    first_frame,
    reset_request,
)
from worldstep.envs.outcomes import step_episodes
from worldstep.envs.scene import SimulatorScene

DEFAULT_PROMPT = "A robot arm pushes a block across a table."


class WorldModelEnv(gym.Env[dict[str, np.ndarray], np.ndarray]):
    """
    ## Description

    An action-conditioned video world model (NVIDIA Cosmos3-Edge) driven like a simulator. A reset opens a
    rollout session from a first frame, a text prompt and an embodiment: the prompt is prefilled once into
    protected KV pages and the first frame is encoded as the clean latent frame 0. Each ``step(actions)``
    generates one window of ``chunk_size`` frames conditioned on ``chunk_size`` actions: the window is
    denoised against the paged KV cache of the prompt and the committed past windows, committed into the
    cache (windows older than ``context_frames`` slide out), and decoded by a warm streaming VAE decoder into
    the frames returned as the observation. With ``observation="latents"`` the step skips the decode and returns
    the window's latents; ``render()`` decodes on demand.

    The env does what only the world model can do. What gymnasium puts in wrappers is in wrappers
    (``worldstep.envs.wrappers.episode``), applied by ``worldstep.make_env`` and ``gym.make`` from the config:
    ``NormalizeActions`` (raw actions), ``JudgeSuccess`` (success, termination and reward) and the window limit
    (``WindowLimit``, a ``TimeLimit`` counted in windows; under ``gym.make``, gymnasium's own ``TimeLimit``).

    ## Action Space

    The action is a ``ndarray`` with shape ``(chunk_size, action_width)``, dtype float32, values in
    ``[-1, 1]``: one row per frame of the window, the embodiment's normalised action vector. Row ``i``
    drives frame ``i`` of the window. The width is the embodiment's raw width (10 for ``droid_lerobot``);
    the model zero-pads the remaining dimensions of its ``action_dim``.

    ## Observation Space

    The observation is a ``dict``:

    | Key    | Observation                      | Shape                      | Dtype | Min | Max |
    |--------|----------------------------------|----------------------------|-------|-----|-----|
    | frames | the window's decoded RGB frames  | (chunk_size, H, W, 3)      | uint8 | 0   | 255 |

    With ``observation="latents"`` the dict holds ``latents`` instead, and no step calls the VAE decoder:

    | Key     | Observation                                  | Shape                      | Dtype   | Min   | Max  |
    |---------|----------------------------------------------|----------------------------|---------|-------|------|
    | latents | the window's normalised (model-space) latents | (chunk_size // 4, C, h, w) | float32 | -3e38 | 3e38 |

    ``C`` is the VAE's latent channels and ``h x w`` the latent grid (the frame size over the VAE's spatial
    compression); the bounds are float32's finite range (the engine refuses NaN and inf). After ``reset`` it holds
    frame 0's latent, repeated. ``render()`` then decodes the windows no one has looked at, oldest first, through
    the model's warm decoder, and returns the frame the frames env shows at that step (same seed, same actions);
    its cost grows with the windows skipped (docs/observations.md).

    ``H x W`` is the model's frame size, or with ``resolution_tier`` the first frame's content on the pipeline's
    canvas (``content // 16 * 16``; the padding is cropped).

    After ``reset``, ``frames`` holds the model's decoded first frame (the VAE round trip of the given
    image) repeated ``chunk_size`` times, so every observation has the same shape. The frames play at
    ``metadata["frame_fps"]`` (the embodiment's fps); ``render()`` returns one frame per window, so
    ``metadata["render_fps"]`` is ``frame_fps / chunk_size`` (what ``gymnasium.wrappers.RecordVideo`` needs).

    ## Rewards

    A world model predicts frames, not rewards: the reward is 0.0. ``JudgeSuccess`` gives one.

    ## Starting State

    The first frame is ``options["image"]`` of ``reset``, else the constructor's ``image``, else the first
    frame of ``simulator`` reset with the same seed (``info["scene_seed"]``), else a tabletop scene (a blue
    block and a red end-effector) drawn from ``self.np_random``. The diffusion
    noise of every window comes from a ``torch.Generator`` seeded from ``self.np_random`` at reset, so
    the same seed and the same actions give the same frames.

    ## Episode End

    The env never terminates by itself. It truncates when the KV page pool cannot hold the next window
    (``info["kv_exhausted"]``): the session is closed and its pages returned, the observation repeats the last
    frames. Reset to continue. ``JudgeSuccess`` terminates on success; the window limit truncates after
    ``max_windows`` windows (``max_episode_steps`` under ``gym.make``).

    ## Arguments

    - ``model``: a loaded ``Cosmos3WorldModel`` (``worldstep.load(...).model``); envs share it. Its page pool
      must hold one episode's prompt, first frame and first window (else ``ValueError`` naming
      ``cache.num_pages`` and the minimum).
    - ``knobs``: ``RolloutKnobs`` (chunk_size, num_steps, guidance_scale, context_frames, window_mode, ...).
    - ``embodiment``: a registered name (``"droid_lerobot"``, ``"agibotworld"``, ``"pusht"``, ...; see
      ``model.embodiments``), a domain id whose embodiments share one width, or a ``Conditioning`` from
      ``model.conditioning(knobs, env_rule=True, embodiment=..., domain_id=..., action_width=..., fps=...)`` for
      an explicit fps, width or domain. It fixes the domain, the exact action width, the fps of the positions,
      caption and ``metadata["frame_fps"]`` (its ``default_fps``, else the model's), and the caption's view point
      (unless ``knobs.view_point`` is set). A bad name, id or width is a ``ValueError`` naming the embodiment,
      its width and the allowed names. None: the checkpoint's only embodiment when it registers exactly one (the
      shipped ``pusher``). A reset's ``domain_id`` must be the embodiment's. It is resolved once (here, or by
      ``make_env``) into the ``Conditioning`` record every episode is opened with.
    - ``prompt``, ``image``: defaults of the reset options of the same names (an option that is missing or None
      takes its default; an unknown option key raises ``ValueError``).
    - ``resolution_tier``: None keeps the model's frame size (the first frame is cover-cropped). 256, 480, 704, 720
      or ``"auto"`` put it on the pipeline's canvas (tier, aspect bin, resize, reflect padding) and crop the
      padding from every frame: the canvas is fixed at construction from ``image`` (else the model's frame
      size), the observation is the content's size, every reset image must give the same canvas and size, and
      the reset ``info`` carries ``resolution_tier`` and ``aspect_bin``.
    - ``simulator``: gymnasium id of the ground-truth simulator the model was trained on (e.g.
      ``"worldstep/PushSim-v0"``); resets without an image start from its first frame for the same seed, and its
      pixel judge is ``JudgeSuccess``'s ``"sim"``.
    - ``render_mode``: ``"rgb_array"`` (``render()`` returns the latest frame) or None.
    - ``knobs.decode``: True (the default) observes decoded frames; False observes the window's latents (no decode
      per step, ``render()`` decodes on demand). ``make_env``/``gym.make`` spell it ``observation="frames"`` or
      ``"latents"``.

    ```python
    >>> import gymnasium as gym, worldstep
    >>> env = gym.make("worldstep/Tiny-v0")
    >>> obs, info = env.reset(seed=0, options={"prompt": "pick up the red cube", "domain_id": 8})
    >>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    ```

    ## Version History

    * v0: Initial version: windowed KV rollout of Cosmos3 forward dynamics. ``observation="latents"`` added
      (the default observation is unchanged).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 6, "frame_fps": 24}

    def __init__(
        self,
        model: Cosmos3WorldModel,
        knobs: RolloutKnobs | None = None,
        *,
        embodiment: str | int | Conditioning | None = None,
        prompt: str = DEFAULT_PROMPT,
        image: np.ndarray | None = None,
        resolution_tier: int | str | None = None,
        simulator: str | None = None,
        render_mode: str | None = None,
    ) -> None:
        knobs = check_model_and_knobs(model, knobs, "latents")  # knobs.decode False: latent observations
        observation = "frames" if knobs.decode else "latents"
        spec = model.spec
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r} is invalid; allowed: None or 'rgb_array'")
        self.observation_mode = observation
        self.prompt = check_prompt("prompt", prompt)
        self.image = None if image is None else check_image("image", image)
        cond = env_conditioning(model, knobs, embodiment)
        self.domain_id, self.conditioning = cond.domain_id, cond
        size = (spec.height, spec.width) if self.image is None else self.image.shape[:2]  # the canvas's reference
        frame = frame_for_size(spec, model.transformer.config.latent_patch_size, *size, resolution_tier)
        self.simulator = simulator
        self._scene = None if simulator is None else SimulatorScene(simulator)
        self.rules = EpisodeRules(model, knobs, cond, frame=frame, observation=observation)
        check_pool(model, knobs, self.prompt, "prompt", cond, frame)
        self.render_mode = render_mode
        # the frames play at the session's fps (the embodiment's); render() returns one frame per window
        self.metadata = {**type(self).metadata, "render_fps": cond.fps / knobs.chunk_size, "frame_fps": cond.fps}
        self.action_space = spaces.Box(*ACTION_BOUNDS, (knobs.chunk_size, cond.action_width), np.float32)
        self._action_bounds: tuple[float, float] | None = ACTION_BOUNDS  # see set_action_bounds
        self.observation_space = observation_space(knobs, frame.spec, observation)
        self.episode: Episode | None = None  # the live rollout between two resets
        self._closed = False  # close() was called and no reset since

    @property
    def embodiment(self) -> str:
        """The embodiment's name (a domain id given alone stands for its embodiment)."""
        return self.rules.embodiment

    @property
    def model(self) -> Cosmos3WorldModel:
        return self.rules.model

    @property
    def knobs(self) -> RolloutKnobs:
        return self.rules.knobs

    # --- gymnasium API ---------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        request = reset_request(options, self.image, self.prompt, self.domain_id, self.model.spec.num_domains)
        self.rules.check_domain(request.domain_id)  # an id the embodiment contradicts: before any work
        if request.prompt != self.prompt:
            check_pool(self.model, self.knobs, request.prompt, "options['prompt']", self.conditioning,
                       self.rules.frame)
        if request.image is not None:
            self.rules.check_frame(request.image, "options['image']" if options and "image" in options else "image")
        super().reset(seed=seed)
        frame = self.rules.frame
        size = frame.plan.source if frame.plan is not None else (frame.spec.height, frame.spec.width)
        image, scene_seed = first_frame(request, self._scene, seed, self.np_random, *size)
        if request.image is None:
            self.rules.check_frame(image, f"the first frame of {self.simulator or 'the drawn scene'}")
        self._close_episode()  # options are valid: free the old episode's pages before opening the new one
        self.episode, self._closed = Episode.open(self.rules, image, request, self.np_random,
                                                   self._action_bounds), False
        info = self.episode.reset_info()
        if scene_seed is not None:
            info["scene_seed"] = scene_seed
        return self.episode.observation(), info

    def step(self, actions: np.ndarray):
        return self.step_live(actions, self.live_episode())

    def step_live(self, actions: np.ndarray, episode: Episode):
        """``step`` on ``episode``, taken from ``live_episode()`` once by the caller (this env's ``step``, or the
        outermost ``SplitStep`` wrapper): a ``close()`` in another thread cannot pull it away mid-step."""
        outcome = step_episodes([episode], [actions])[0]
        if isinstance(outcome, Exception):  # the session was closed under the step
            raise outcome
        return outcome

    def render(self) -> np.ndarray | None:
        if self.render_mode is None:
            gym.logger.warn(
                "You are calling render method without specifying any render mode. "
                "You can specify the render_mode at initialization, "
                'e.g. gym.make("worldstep/Tiny-v0", render_mode="rgb_array")'
            )
            return None
        return self.last_frame()

    def last_frame(self) -> np.ndarray | None:
        """What ``render()`` returns, whatever the ``render_mode``: the latest frame (None before a reset). In latent
        mode it decodes the windows skipped since the last look, oldest first."""
        if self.episode is None:
            return None
        return self.episode.latest_frames()[-1].copy()

    def close(self) -> None:
        """Close the episode: every KV page and decoder cache it held goes back. Safe to call twice."""
        self._closed = True
        self._close_episode()
        if self._scene is not None:
            self._scene.close()
        super().close()

    # --- beyond gymnasium ------------------------------------------------------------------

    def fork(self, seed: int | None = None) -> WorldModelEnv:
        """An independent env continuing from this env's current state.

        The engine session forks (committed KV pages shared by reference, decoder cache copied) and the
        env's RNG is copied, so the fork and this env step identically given the same actions. With
        ``seed`` the fork's RNG and diffusion noise are reseeded instead, to sample a different future.
        """
        if self.episode is None or not self.episode.live:
            raise gym.error.ResetNeeded("Cannot fork an env without a live episode; call reset() first.")
        other = copy.copy(self)
        other.action_space = copy.deepcopy(self.action_space)  # spaces carry their own sampling RNG
        other.observation_space = copy.deepcopy(self.observation_space)
        other._scene = None if self.simulator is None else SimulatorScene(self.simulator)  # closed with the fork
        generator = None  # the engine copies this session's generator state
        if seed is None:
            other.np_random = copy.deepcopy(self.np_random)
        else:
            other.np_random, _ = gym.utils.seeding.np_random(seed)
            generator = torch.Generator().manual_seed(int(other.np_random.integers(2**63)))
        other.episode = self.episode.fork(generator)
        return other

    def live_episode(self) -> Episode:
        """The live episode, read once (ResetNeeded before a reset, ClosedEnvironmentError after close)."""
        episode = self.episode
        if episode is None or not episode.live:
            if self._closed:
                raise gym.error.ClosedEnvironmentError(
                    "Cannot call env.step() after env.close(); call env.reset() to start a new episode")
            raise gym.error.ResetNeeded("Cannot call env.step() before calling env.reset()")
        return episode

    @property
    def action_bounds(self) -> tuple[float, float] | None:
        """What the engine holds each window's actions to (None: no bounds)."""
        return self._action_bounds

    def set_action_bounds(self, bounds: tuple[float, float] | None) -> None:
        """Hold the actions of the next episodes to ``bounds`` (``(low, high)``), or to none: ``NormalizeActions``
        hands the env model-space actions that may leave ``[-1, 1]`` (unclipped, as in training). Applies from the
        next reset."""
        if bounds is not None:
            ok = isinstance(bounds, tuple) and len(bounds) == 2 and all(
                isinstance(b, (int, float)) and not isinstance(b, bool) and np.isfinite(b) for b in bounds)
            if not ok or not bounds[0] < bounds[1]:
                raise ValueError(f"bounds={bounds!r} is invalid; allowed: None or (low, high) finite numbers, "
                                 "low < high")
            bounds = (float(bounds[0]), float(bounds[1]))
        self._action_bounds = bounds

    @property
    def first_image(self) -> np.ndarray | None:
        """The image the current episode started from (None before a reset): the simulator judge's goal."""
        return None if self.episode is None else self.episode.first_image

    @property
    def windows(self) -> int:
        """Windows generated in the current episode."""
        return 0 if self.episode is None else self.episode.windows

    def simulator_judge(self) -> Callable[[np.ndarray, np.ndarray], bool] | None:
        """The simulator's pixel judge ``success_from_frames(first_frame, frames)`` (None without a simulator or
        when it has none): ``JudgeSuccess``'s ``"sim"``."""
        return None if self._scene is None else self._scene.success_judge()

    def _close_episode(self) -> None:
        episode, self.episode = self.episode, None
        if episode is not None:
            episode.close()


def check_model_and_knobs(model: Any, knobs: Any, observation: Any = "frames") -> RolloutKnobs:
    """The knobs (None: the defaults) of an env of ``model`` observing ``observation``; TypeError or ValueError
    naming the argument."""
    if not isinstance(model, Cosmos3WorldModel):
        raise TypeError(f"model={model!r} is invalid; allowed: a loaded Cosmos3WorldModel")
    if not isinstance(observation, str) or observation not in OBSERVATIONS:
        raise ValueError(f"observation={observation!r} is invalid; allowed: {', '.join(map(repr, OBSERVATIONS))}")
    knobs = RolloutKnobs() if knobs is None else knobs
    if not isinstance(knobs, RolloutKnobs) or not (knobs.decode or observation == "latents"):
        raise ValueError(f"knobs={knobs!r} is invalid; allowed: RolloutKnobs with decode=True, or "
                         "observation='latents' (which decodes only in render())")
    return knobs


def observation_space(knobs: RolloutKnobs, spec: ModelSpec, observation: str) -> spaces.Dict:
    """The env's observation space: the window's uint8 frames, or its float32 latents ``(t, C, h, w)``."""
    if observation == "latents":
        shape = (knobs.latents_per_window, spec.latent_channels, spec.latent_height, spec.latent_width)
        finite = float(np.finfo(np.float32).max)  # any finite value: the engine refuses NaN and inf latents
        return spaces.Dict({"latents": spaces.Box(-finite, finite, shape, np.float32)})
    return spaces.Dict({"frames": spaces.Box(0, 255, (knobs.chunk_size, spec.height, spec.width, 3), np.uint8)})


def env_conditioning(model: Cosmos3WorldModel, knobs: RolloutKnobs, embodiment: Any) -> Conditioning:
    """The env's checked conditioning, resolved once: the engine's resolution of a name or domain id, or a given
    ``Conditioning`` that the engine resolved for this model and knobs like these (taken as it is)."""
    if not isinstance(embodiment, Conditioning):
        return model.conditioning(knobs, env_rule=True, embodiment=embodiment)
    allowed = ("allowed: model.conditioning(knobs, env_rule=True, embodiment=..., domain_id=..., action_width=..., "
               "fps=...) of this model and knobs")
    if embodiment.embodiment is None:
        raise ValueError(f"embodiment={embodiment!r} is invalid: it names no embodiment; {allowed}")
    if not model.resolved_here(embodiment, knobs):
        raise ValueError(f"embodiment={embodiment!r} is invalid for this model and knobs (this model resolved no "
                         f"such record for view point {knobs.view_point!r}); {allowed}")
    return embodiment
