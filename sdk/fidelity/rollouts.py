"""World-model and simulator rollouts for the fidelity report, batched through one model call per window."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from worldstep.engine.config import RolloutKnobs
from worldstep.envs.push_sim import PushSimEnv, frame_success

from ..episodes import EpisodeResult


@dataclass(frozen=True)
class RolloutRecipe:
    """How the report rolls the model out: the prompt, the embodiment and the engine's `RolloutKnobs`
    (each run sets its own ``window_mode``)."""

    prompt: str
    domain_id: int
    knobs: RolloutKnobs

    @property
    def chunk_size(self) -> int:
        return self.knobs.chunk_size

    def knobs_for(self, mode: str) -> RolloutKnobs:
        return self.knobs.replace(window_mode=mode)

    def to_dict(self) -> dict[str, Any]:
        """The prompt, domain and every knob (the report's ``settings``)."""
        return {"prompt": self.prompt, "domain_id": self.domain_id, **self.knobs.model_dump()}


def open_loop(world, first_frames: np.ndarray, actions: np.ndarray, recipe: RolloutRecipe, mode: str,
              seeds: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Model frames `[N, W*chunk, H, W, 3]` for first frames `[N, H, W, 3]` and actions `[N, W*chunk, 2]`,
    and each session's decoded first frame `[N, H, W, 3]` (the VAE round trip of the given one); clip i's
    diffusion noise is seeded by `seeds[i]`."""
    chunk = recipe.chunk_size
    windows = actions.shape[1] // chunk
    sessions = [world.open_session(frame, recipe.prompt, recipe.domain_id, knobs=recipe.knobs_for(mode),
                                   generator=torch.Generator().manual_seed(seed), action_width=actions.shape[-1])
                for frame, seed in zip(first_frames, seeds)]
    out = []
    try:
        for w in range(windows):
            results = world.step(sessions, [a[w * chunk:(w + 1) * chunk] for a in actions])
            out.append(np.stack([r.frames for r in results]))
        decoded_first = np.stack([s.first_frame for s in sessions])
    finally:
        for s in sessions:
            world.close(s)
    return np.concatenate(out, axis=1), decoded_first


@dataclass
class EpisodeOutcome:
    """One episode of one policy from one start seed: the common `episode` result (`success`: the frames the
    policy saw showed success) and what the report adds. `replay_success`: the model episode's chunks replayed
    in the simulator (None for simulator episodes). `actions` holds the chunks it chose, `stop` why it ended
    (`success` or `max_windows`), and `detections` per window what the detector found in the last frame of each
    world (`model`, `sim`: effector and block centres or None). `continued`: the trust study's windows past the
    stop (`model_episodes`' `continue_windows`), each with its chunk and that window's own replay success."""

    episode: EpisodeResult
    policy: str
    replay_success: bool | None = None
    actions: list = field(default_factory=list)
    stop: str = "max_windows"
    detections: list = field(default_factory=list)
    continued: list = field(default_factory=list)

    def to_record(self) -> dict[str, Any]:
        """The episode's row in `episodes.jsonl` (without its `world`)."""
        e = self.episode
        return {"policy": self.policy, "seed": e.seed, "success": e.success, "windows": e.windows,
                "replay_success": self.replay_success, "actions": self.actions, "stop": self.stop,
                "detections": self.detections, **({"continued": self.continued} if self.continued else {})}

    @classmethod
    def from_record(cls, row: dict[str, Any], index: int = 0) -> EpisodeOutcome:
        """The outcome a `to_record` row describes (episode `index` of its run)."""
        episode = EpisodeResult(index=index, seed=row["seed"], windows=row["windows"], success=row["success"])
        return cls(episode, row["policy"], row["replay_success"], row["actions"], row["stop"], row["detections"],
                   row.get("continued", []))


def detections_of(frame: np.ndarray) -> dict[str, list[float] | None]:
    """Effector and block centres the simulator's detector finds in `frame` (None: not found)."""
    from worldstep.envs.push_sim import detect_objects

    found = detect_objects(frame)
    return {k: None if found[k] is None else [round(float(v), 3) for v in found[k]] for k in ("effector", "block")}


def sim_episodes(policies: list, seeds: list[int], max_windows: int, chunk: int) -> list[EpisodeOutcome]:
    """Run every policy for every seed in the simulator; success is `frame_success` on the frames."""
    results = []
    for policy in policies:
        for seed in seeds:
            env = PushSimEnv(chunk_size=chunk)
            obs, _ = env.reset(seed=seed)
            policy.reset(seed=seed)
            goal = _goal(obs)
            outcome = EpisodeOutcome(EpisodeResult(index=len(results), seed=seed), policy.name)
            episode = outcome.episode
            while episode.windows < max_windows and not episode.success:
                actions = policy(obs)
                obs, *_ = env.step(actions)
                episode.windows += 1
                episode.frames += len(obs["frames"])
                episode.success = any(frame_success(f, goal) for f in obs["frames"])
                outcome.actions.append(np.asarray(actions, dtype=np.float32).round(5).tolist())
                outcome.detections.append({"sim": detections_of(obs["frames"][-1]), "sim_success": episode.success})
            outcome.stop = "success" if episode.success else "max_windows"
            results.append(outcome)
    return results


def model_episodes(world, policies: list, seeds: list[int], max_windows: int, recipe: RolloutRecipe,
                   mode: str = "kv", policy_ids: list[int] | None = None, continue_windows: int = 0,
                   agreement_forks: int = 0) -> list[EpisodeOutcome]:
    """The same episodes in the world model (all policies x seeds stepped as one batch per window), every
    chunk also replayed in the simulator (`replay_success`).

    `policy_ids` (default 0..P-1) seed each episode's model noise (`noise_seed`), so splitting the
    policies across workers does not change any episode. For the trust study, an episode can go on
    `continue_windows` windows past its first model success (`EpisodeOutcome.continued`; its outcome stays
    the one at the stop), and every window can also be stepped by `agreement_forks` forks of the session
    with other noise seeds (`fork_seed`), which share its past pages and are closed after the window: each
    window's detections then hold `forks`, whether each fork's frames show success.
    """
    import copy

    chunk = recipe.chunk_size
    jobs = []
    for p_index, policy in zip(policy_ids or range(len(policies)), policies):
        for seed in seeds:
            sim = PushSimEnv(chunk_size=chunk)
            obs, _ = sim.reset(seed=seed)
            agent = copy.deepcopy(policy)
            agent.reset(seed=seed)
            session = world.open_session(obs["frames"][0], recipe.prompt, recipe.domain_id,
                                         knobs=recipe.knobs_for(mode),
                                         generator=torch.Generator().manual_seed(noise_seed(seed, p_index)),
                                         action_width=sim.action_space.shape[1])
            outcome = EpisodeOutcome(EpisodeResult(index=len(jobs), seed=seed), agent.name, replay_success=False)
            jobs.append({"agent": agent, "obs": obs, "goal": _goal(obs), "session": session, "sim": sim,
                         "done": False, "outcome": outcome, "left": continue_windows, "noise": (seed, p_index)})
    try:
        for _ in range(max_windows + continue_windows):
            live = [j for j in jobs if not j["done"]]
            if not live:
                break
            chunks = [j["agent"](j["obs"]) for j in live]
            forks = [[world.fork(j["session"], torch.Generator().manual_seed(fork_seed(*j["noise"], k)))
                      for k in range(agreement_forks)] for j in live]
            try:
                results = world.step([j["session"] for j in live] + [f for fs in forks for f in fs],
                                     chunks + [c for c, fs in zip(chunks, forks) for _ in fs])
            finally:
                for f in (f for fs in forks for f in fs):
                    world.close(f)
            fork_results = iter(results[len(live):])
            for job, result, actions in zip(live, results, chunks):
                mine = [next(fork_results) for _ in range(agreement_forks)]
                _advance(world, job, result, actions, [any(frame_success(f, job["goal"]) for f in r.frames)
                                                       for r in mine] if agreement_forks else None, max_windows)
    finally:
        for j in jobs:
            world.close(j["session"])
    return [j["outcome"] for j in jobs]


def _advance(world, job: dict, result, actions, forks: list[bool] | None, max_windows: int) -> None:
    """Record one window of a model episode (and its replay); stop it at its first success, or after its
    continuation windows, or at `max_windows`."""
    outcome, episode = job["outcome"], job["outcome"].episode
    job["obs"] = {"frames": result.frames}
    sim_obs, *_ = job["sim"].step(actions)
    sim_now = any(frame_success(f, job["goal"]) for f in sim_obs["frames"])
    model_success = any(frame_success(f, job["goal"]) for f in result.frames)
    window = {"model": detections_of(result.frames[-1]), "sim": detections_of(sim_obs["frames"][-1]),
              "model_success": model_success}
    if forks is not None:
        window["forks"] = forks
    if outcome.stop == "success":  # a continuation window: observed, the outcome stays the stop's
        outcome.continued.append({**window, "sim_success": sim_now,
                                  "actions": np.asarray(actions, dtype=np.float32).round(5).tolist()})
        job["left"] -= 1
    else:
        episode.windows += 1
        episode.frames += len(result.frames)
        outcome.replay_success = outcome.replay_success or sim_now
        outcome.actions.append(np.asarray(actions, dtype=np.float32).round(5).tolist())
        outcome.detections.append({**window, "sim_success": outcome.replay_success})
        if model_success:
            episode.success, outcome.stop = True, "success"
    if (outcome.stop == "success" and job["left"] <= 0) or (outcome.stop != "success"
                                                              and episode.windows >= max_windows):
        job["done"] = True
        world.close(job["session"])


def noise_seed(seed: int, policy_index: int) -> int:
    """The diffusion-noise seed of policy `policy_index`'s model episode from start `seed` (distinct per pair)."""
    return 1_000 * seed + policy_index


def fork_seed(seed: int, policy_index: int, fork: int) -> int:
    """The noise seed of agreement fork `fork` (0..98) of that episode: distinct from every `noise_seed`."""
    if not 0 <= fork < 99:
        raise ValueError(f"fork={fork} is invalid; allowed: 0..98")
    return 1_000 * seed + 10 * (fork + 1) + policy_index


def _goal(obs: dict[str, np.ndarray]):
    from worldstep.envs.push_sim import detect_objects

    return detect_objects(obs["frames"][0])["goal"]
