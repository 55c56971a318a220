"""World-model and simulator rollouts for the fidelity report, batched through one model call per window."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from worldstep.envs.push_sim import PushSimEnv, frame_success


@dataclass(frozen=True)
class RolloutSettings:
    """The rollout knobs the report runs the model with (see `RolloutKnobs`)."""

    prompt: str
    domain_id: int
    chunk_size: int = 4
    num_steps: int = 4
    context_frames: int = 4
    flow_shift: float = 5.0

    def knobs(self, mode: str):
        from worldstep.engine.models.cosmos3 import RolloutKnobs

        return RolloutKnobs(chunk_size=self.chunk_size, num_steps=self.num_steps, context_frames=self.context_frames,
                            window_mode=mode, flow_shift=self.flow_shift)


def open_loop(world, first_frames: np.ndarray, actions: np.ndarray, settings: RolloutSettings, mode: str,
              seed: int) -> np.ndarray:
    """Model frames `[N, W*chunk, H, W, 3]` for first frames `[N, H, W, 3]` and actions `[N, W*chunk, 2]`."""
    chunk = settings.chunk_size
    windows = actions.shape[1] // chunk
    sessions = [world.open_session(frame, settings.prompt, settings.domain_id, knobs=settings.knobs(mode),
                                   generator=torch.Generator().manual_seed(seed + i), action_width=actions.shape[-1])
                for i, frame in enumerate(first_frames)]
    out = []
    try:
        for w in range(windows):
            results = world.step(sessions, [a[w * chunk:(w + 1) * chunk] for a in actions])
            out.append(np.stack([r.frames for r in results]))
    finally:
        for s in sessions:
            world.close(s)
    return np.concatenate(out, axis=1)


@dataclass
class EpisodeResult:
    policy: str
    seed: int
    success: bool
    windows: int


def sim_episodes(policies: list, seeds: list[int], max_windows: int, chunk: int) -> list[EpisodeResult]:
    """Run every policy for every seed in the simulator; success is `frame_success` on the frames."""
    results = []
    for policy in policies:
        for seed in seeds:
            env = PushSimEnv(chunk_size=chunk)
            obs, _ = env.reset(seed=seed)
            policy.reset(seed=seed)
            goal = _goal(obs)
            success, used = False, 0
            while used < max_windows and not success:
                obs, *_ = env.step(policy(obs))
                used += 1
                success = any(frame_success(f, goal) for f in obs["frames"])
            results.append(EpisodeResult(policy.name, seed, success, used))
    return results


def model_episodes(world, policies: list, seeds: list[int], max_windows: int, settings: RolloutSettings,
                   mode: str = "kv", policy_ids: list[int] | None = None) -> list[EpisodeResult]:
    """The same episodes in the world model (all policies x seeds stepped as one batch per window).

    `policy_ids` (default 0..P-1) seed each episode's model noise, so splitting the policies across
    workers does not change any episode.
    """
    import copy

    chunk = settings.chunk_size
    jobs = []
    for p_index, policy in zip(policy_ids or range(len(policies)), policies):
        for seed in seeds:
            obs, _ = PushSimEnv(chunk_size=chunk).reset(seed=seed)
            agent = copy.deepcopy(policy)
            agent.reset(seed=seed)
            session = world.open_session(obs["frames"][0], settings.prompt, settings.domain_id,
                                         knobs=settings.knobs(mode),
                                         generator=torch.Generator().manual_seed(10_000 * p_index + seed),
                                         action_width=PushSimEnv(chunk_size=chunk).action_space.shape[1])
            jobs.append({"agent": agent, "seed": seed, "obs": obs, "goal": _goal(obs), "session": session,
                         "done": False, "success": False, "windows": 0})
    try:
        for _ in range(max_windows):
            live = [j for j in jobs if not j["done"]]
            if not live:
                break
            results = world.step([j["session"] for j in live], [j["agent"](j["obs"]) for j in live])
            for job, result in zip(live, results):
                job["obs"] = {"frames": result.frames}
                job["windows"] += 1
                if any(frame_success(f, job["goal"]) for f in result.frames):
                    job["success"], job["done"] = True, True
                    world.close(job["session"])
    finally:
        for j in jobs:
            world.close(j["session"])
    return [EpisodeResult(j["agent"].name, j["seed"], j["success"], j["windows"]) for j in jobs]


def _goal(obs: dict[str, np.ndarray]):
    from worldstep.envs.push_sim import detect_objects

    return detect_objects(obs["frames"][0])["goal"]
