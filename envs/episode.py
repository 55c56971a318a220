"""One env episode: its engine session, its last frames, and the gymnasium outcome of each window.

`WorldModelEnv` holds one `Episode`; `WorldModelVectorEnv` holds ``num_envs`` and steps all their sessions
through ONE engine call, then hands each result back to its episode. Both envs therefore report exactly the
same observations, rewards, flags and infos for the same windows.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from worldstep.engine.checks import check_image, check_int, check_prompt
from worldstep.engine.config import RolloutKnobs
from worldstep.engine.embodiment.conditioning import Conditioning
from worldstep.engine.models.cosmos3.canvas import plan_first_frame
from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel
from worldstep.engine.session import RolloutSession
from worldstep.engine.spec import SessionFrame, WindowResult

from .latent_frames import LatentFrames
from .scene import SimulatorScene, draw_tabletop

RESET_OPTION_KEYS = ("image", "prompt", "domain_id")
ACTION_BOUNDS = (-1.0, 1.0)  # the env's Box: normalised actions
OBSERVATIONS = ("frames", "latents")  # what a step returns: decoded frames, or the window's latents (no decode)


@dataclass(frozen=True)
class EpisodeRules:
    """What every episode of one env shares: the model, its knobs, its conditioning and its canvas.

    Judging, rewards, action normalisation and the window limit are wrappers (``wrappers.episode``); an episode
    only runs windows.
    """

    model: Cosmos3WorldModel
    knobs: RolloutKnobs
    conditioning: Conditioning  # resolved once, when the env was made; every episode is opened with it
    frame: SessionFrame | None = None  # the env's fixed canvas (None: the model's frame size, cover-cropped)
    observation: str = "frames"  # one of OBSERVATIONS; "latents": the knobs say decode=False

    @property
    def action_width(self) -> int:
        return self.conditioning.action_width

    @property
    def embodiment(self) -> str | None:
        """The embodiment's name."""
        found = self.conditioning.embodiment
        return None if found is None else found.name

    @property
    def latent_mode(self) -> bool:
        return self.observation == "latents"

    @property
    def tier(self) -> int | None:
        """The resolution tier every episode's first frame goes onto (None: the model's frame size)."""
        return None if self.frame is None or self.frame.plan is None else self.frame.plan.tier

    def check_frame(self, image: np.ndarray, field: str) -> None:
        """A ValueError when ``image`` would not give this env's canvas and frame size (fixed spaces)."""
        if self.tier is None:
            return
        want = self.frame.plan
        got = plan_first_frame(int(image.shape[0]), int(image.shape[1]), want.tier, want.spatial)
        if (got.canvas, got.latent_size) != (want.canvas, want.latent_size):
            raise ValueError(
                f"{field} of size {image.shape[0]}x{image.shape[1]} is invalid for this env's canvas "
                f"(tier {want.tier}, aspect bin {want.aspect_bin}, {want.output_size[0]}x{want.output_size[1]} "
                "frames): it gives a "
                f"{got.canvas[0]}x{got.canvas[1]} canvas and {got.output_size[0]}x{got.output_size[1]} frames; "
                f"allowed: an image that gives the env's, e.g. {want.source[0]}x{want.source[1]}")

    def check_domain(self, domain_id: int) -> None:
        """A ValueError, before any model work, when a reset's ``domain_id`` is not the env's embodiment's."""
        self.conditioning.check_domain(domain_id)


@dataclass(frozen=True)
class ResetRequest:
    """A reset's checked options: ``image`` None means the scene is drawn (or the simulator's)."""

    image: np.ndarray | None
    prompt: str
    domain_id: int


def reset_request(options: Any, image: np.ndarray | None, prompt: str, domain_id: int,
                  num_domains: int) -> ResetRequest:
    """Reset options over the env's defaults (a missing or None key takes the default); unknown keys and bad
    values raise ValueError before anything changes. The defaults were checked when the env was made: only an
    image or a prompt the options give is checked here, where it enters."""
    if options is not None and not isinstance(options, Mapping):
        raise ValueError(f"options={options!r} is invalid; allowed: a dict with keys {RESET_OPTION_KEYS}")
    unknown = sorted(set(options or {}) - set(RESET_OPTION_KEYS), key=str)
    if unknown:
        key = unknown[0]
        near = difflib.get_close_matches(str(key), RESET_OPTION_KEYS, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ValueError(f"options[{key!r}] is invalid{hint}; allowed keys: {', '.join(RESET_OPTION_KEYS)}")
    given = {k: v for k, v in (options or {}).items() if v is not None}
    return ResetRequest(
        image=check_image("options['image']", given["image"]) if "image" in given else image,
        prompt=check_prompt("options['prompt']", given["prompt"]) if "prompt" in given else prompt,
        domain_id=check_int("options['domain_id']", given.get("domain_id", domain_id), 0, num_domains),
    )


def first_frame(request: ResetRequest, scene: SimulatorScene | None, seed: int | None,
                np_random: np.random.Generator, height: int, width: int) -> tuple[np.ndarray, int | None]:
    """The episode's first frame and, when it came from the simulator, the simulator seed that reproduces it."""
    if request.image is not None:
        return request.image, None
    if scene is not None:
        image, scene_seed = scene(seed, np_random)
        return check_image(f"first frame of simulator {scene.env_id!r}", image), scene_seed
    return draw_tabletop(height, width, np_random), None


class Episode:
    """The live rollout of one env between two resets.

    With ``rules.observation == "latents"`` the engine session decodes nothing: each window's latents are the
    observation, and ``LatentFrames`` decodes them when a frame is asked for (``latest_frames``). Its decoder session
    outlives a truncation by the page pool (the frames stay viewable) and goes back at ``close``.
    """

    def __init__(self, rules: EpisodeRules, session: RolloutSession, first_image: np.ndarray,
                 lazy: LatentFrames | None = None) -> None:
        self.rules = rules
        self.session = session
        self.first_image = first_image  # the image the episode started from (the simulator judge's goal)
        self.lazy = lazy  # latent mode: the frames decoded on demand; None: every window is decoded at its step
        if lazy is None:
            self.frames = np.repeat(session.first_frame[None], rules.knobs.chunk_size, axis=0)
        else:  # reset's latents: frame 0's latent repeated, as reset's frames repeat frame 0
            first = latents_observation(session.first_latent)
            self.latents = np.repeat(first, rules.knobs.latents_per_window, axis=0)
        self.windows = 0

    @classmethod
    def open(cls, rules: EpisodeRules, image: np.ndarray, request: ResetRequest, np_random: np.random.Generator,
             action_bounds: tuple[float, float] | None) -> Episode:
        """Open the engine session (its diffusion noise seeded from ``np_random``; ``action_bounds``: what the
        engine holds each window's actions to, None for none)."""
        generator = torch.Generator().manual_seed(int(np_random.integers(2**63)))
        session = rules.model.open_checked(image, request.prompt, rules.conditioning, knobs=rules.knobs,
                                           generator=generator, action_bounds=action_bounds, tier=rules.tier)
        if not rules.latent_mode:
            return cls(rules, session, image)
        try:
            return cls(rules, session, image, LatentFrames(rules.model.decoder, session.first_latent))
        except BaseException:
            rules.model.close(session)
            raise

    @property
    def live(self) -> bool:
        return not self.session.closed

    def reset_info(self) -> dict[str, Any]:
        info = {"frame_start": 0, "frame_end": 1, "kv": self.rules.model.kv_stats(self.session)}
        plan = self.session.frame.plan
        if plan is not None:  # the pipeline's canvas: its tier and aspect bin
            info.update(resolution_tier=plan.tier, aspect_bin=plan.aspect_bin)
        return info

    def outcome(self, result: WindowResult) -> tuple:
        """``(obs, 0.0, False, False, info)`` of a window the model has stepped: a world model predicts frames;
        rewards, success and the window limit are the wrappers'."""
        self.windows += 1
        if self.lazy is None:
            self.frames = result.frames
        else:
            self.latents = latents_observation(result.latents)
            self.lazy.add(result.latents)
        info = {"window_index": result.window_index, "frame_start": result.frame_start,
                "frame_end": result.frame_end, "timings": result.timings, "kv": result.kv, "kv_exhausted": False}
        return self.observation(), 0.0, False, False, info

    def exhausted(self) -> tuple:
        """The pool could not hold the window: the episode ends by truncation, its pages returned (a latent episode's
        decoder session stays until ``close``, so its frames can still be rendered)."""
        self.rules.model.close(self.session)
        info = {"window_index": self.windows, "kv_exhausted": True}
        return self.observation(), 0.0, False, True, info

    def observation(self) -> dict[str, np.ndarray]:
        if self.lazy is None:
            return {"frames": self.frames.copy()}
        return {"latents": self.latents.copy()}

    def latest_frames(self) -> np.ndarray:
        """The latest window's frames (frame 0 after a reset); a latent episode decodes the windows it skipped."""
        return self.frames if self.lazy is None else self.lazy.frames()

    def fork(self, generator: torch.Generator | None) -> Episode:
        """An episode continuing from this one (committed KV pages shared; the same RNG unless given one)."""
        session = self.rules.model.fork(self.session, generator=generator)
        try:
            lazy = None if self.lazy is None else self.lazy.fork()
        except BaseException:
            self.rules.model.close(session)
            raise
        fork = Episode(self.rules, session, self.first_image, lazy)
        if lazy is None:
            fork.frames = self.frames.copy()
        else:
            fork.latents = self.latents.copy()
        fork.windows = self.windows
        return fork

    def close(self) -> None:
        """Every KV page of the session and, in latent mode, the decoder session go back (safe to call twice)."""
        try:
            self.rules.model.close(self.session)
        finally:
            if self.lazy is not None:
                self.lazy.close()


def latents_observation(latents: torch.Tensor) -> np.ndarray:
    """``[C, t, h, w]`` latents as the observation's ``(t, C, h, w)`` float32 array (a copy on the CPU)."""
    return np.ascontiguousarray(latents.detach().to("cpu", torch.float32).permute(1, 0, 2, 3).numpy())


def check_pool(model: Cosmos3WorldModel, knobs: RolloutKnobs, prompt: str, field: str,
               conditioning: Conditioning | None = None, frame: SessionFrame | None = None) -> None:
    """ValueError, before anything opens, when the page pool cannot hold one episode's prompt, first frame and
    first window."""
    needed = model.pages_needed(prompt, knobs, conditioning, frame)  # the prompt was checked where it entered
    pool = model.kv.num_pages
    if needed > pool:
        raise ValueError(f"cache.num_pages={pool} is invalid for {field} of {len(prompt)} characters; allowed: "
                         f">= {needed} (the prompt, first frame and first window of one episode, "
                         f"{model.kv.page_size} tokens per page)")
