"""Decisions made in the world model: a model-predictive planner for the pusher, checked in the simulator.

Each window the planner draws ``candidates`` action chunks from a proposal policy, plays each one in a
fork of the world-model env (``fork_env(env)``, inside its wrappers: the fork shares the committed KV pages, so a
candidate costs only its own window) and executes the chunk whose imagined frames put the block
nearest the goal (``BlockToGoal``, read from pixels with the simulator's own detector). The forks start
from the env's RNG state, so every candidate sees the same diffusion noise and only the actions differ.

``closed_loop`` runs any policy (the planner is one) and scores it by the ground-truth simulator, in one
of two ways (``observe``):

- ``"model"``: the policy sees only the world model's frames, window after window, and the simulator
  replays every chosen chunk: decisions made entirely in imagination (model errors compound).
- ``"simulator"``: model-predictive control as on a robot: each window the world model restarts from the
  simulator's latest frame, the planner imagines one window per candidate from there, and the chosen
  chunk runs in the simulator, whose frames the policy sees next.

```python
>>> import worldstep
>>> from worldstep.planning import ModelPredictivePlanner, closed_loop
>>> env = worldstep.make_env("pusher", success_fn="none")  # the closed loop judges success, not the env
>>> planner = ModelPredictivePlanner(env, worldstep.policies.make_policy("push", (4, 2)), candidates=8)
>>> result = closed_loop(env, planner, seed=20_000_000, max_windows=16)
>>> result.sim_success
```
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from worldstep.engine.checks import check_int
from worldstep.envs.push_sim import PushSimEnv, detect_objects
from worldstep.envs.video import frame_fps, video_writer
from worldstep.envs.wrappers import fork_env
from worldstep.envs.wrappers.episode import JudgeSuccess

from .episodes import EpisodeResult
from .measures.ranks import spearman
from .policies import Policy, as_policy
from .trust.rule import SelectiveRule
from .trust.signals import TrustSignals
from .trust.trackers import PushTracker
from .truth import side_by_side

__all__ = ["BlockToGoal", "ClosedLoopResult", "ModelPredictivePlanner", "closed_loop"]


@dataclass(frozen=True)
class BlockToGoal:
    """Cost of imagined frames (lower is better): the pixel distance of the detected block to the goal in
    the window's last frame, plus ``approach_weight`` times the effector's distance to the block (a tie
    breaker between chunks that leave the block where it is; off by default: with the simulator itself as
    the model, noisy0.8 proposals x 8 reach the goal on 59/60 validation episodes at weight 0, 54/60 at 0.1).
    A block the detector cannot find costs ``vanished_px``."""

    approach_weight: float = 0.0
    vanished_px: float = 64.0

    def __post_init__(self) -> None:
        for name in ("approach_weight", "vanished_px"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and np.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value!r} is invalid; allowed: a finite number >= 0")

    def __call__(self, frames: np.ndarray, goal: np.ndarray) -> float:
        found = detect_objects(frames[-1])
        if found["block"] is None:
            return float(self.vanished_px)
        cost = float(np.linalg.norm(found["block"] - goal))
        if found["effector"] is not None:
            cost += self.approach_weight * float(np.linalg.norm(found["effector"] - found["block"]))
        return cost


class ModelPredictivePlanner:
    """A policy that plans in ``env``'s world model: best of ``candidates`` proposals per window.

    ``env`` is the world-model env the planner will be stepped on (its current state is where the
    candidates start); ``proposal`` is any policy whose calls return different chunks (a noisy policy),
    called ``candidates`` times per window on the same observation. A candidate is ``horizon`` windows
    long: its first chunk is the proposal's, the later ones the proposal's own continuation on the
    imagined frames; only the first chunk is executed. Each candidate is imagined in ``forks`` forks with
    different diffusion noise. Its cost is the objective on each fork's last frame (mean over forks),
    plus ``vanish_weight`` x the share of imagined windows whose block the detector cannot find, plus
    ``disagreement_weight`` x the spread (px, mean distance to their centre) of the forks' final block
    positions: a future the model cannot agree on is not one to bet on. The goal is the one seen in the
    episode's first frame unless ``goal`` (x, y) is given. ``last_costs`` and ``last_candidates``
    (each candidate's chunks) hold the latest window's.
    """

    def __init__(self, env: gym.Env, proposal: Policy, candidates: int = 8, objective: BlockToGoal | None = None,
                 *, horizon: int = 2, forks: int = 2, vanish_weight: float = 64.0,
                 disagreement_weight: float = 1.0, goal: np.ndarray | None = None) -> None:
        if not callable(getattr(env.unwrapped, "fork", None)):
            raise TypeError(f"env={env!r} is invalid; allowed: a worldstep world-model env (it must fork)")
        for name, value in (("candidates", candidates), ("horizon", horizon), ("forks", forks)):
            check_int(name, value, 1)
        for name, value in (("vanish_weight", vanish_weight), ("disagreement_weight", disagreement_weight)):
            if not (isinstance(value, (int, float)) and np.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value!r} is invalid; allowed: a finite number >= 0")
        proposal = as_policy(proposal, "proposal")
        self.env, self.proposal, self.candidates = env, proposal, candidates
        self.horizon, self.forks = horizon, forks
        self.vanish_weight, self.disagreement_weight = float(vanish_weight), float(disagreement_weight)
        self.objective = objective if objective is not None else BlockToGoal()
        self.name = f"plan{candidates}_{getattr(proposal, 'name', type(proposal).__name__)}"
        self.known_goal = None if goal is None else np.asarray(goal, dtype=np.float64)
        if self.known_goal is not None and (self.known_goal.shape != (2,) or not np.all(np.isfinite(self.known_goal))):
            raise ValueError(f"goal={goal!r} is invalid; allowed: None or a finite (x, y) pixel position")
        self.goal: np.ndarray | None = self.known_goal
        self.last_costs: list[float] = []
        self.last_candidates: list[list[np.ndarray]] = []
        self._decisions, self._seed = 0, 0

    def reset(self, seed: int | None = None) -> None:
        self.proposal.reset(seed)
        self.goal, self.last_costs, self.last_candidates, self._decisions = self.known_goal, [], [], 0
        self._seed = 0 if seed is None else int(seed)

    def __call__(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        if self.goal is None:
            self.goal = detect_objects(obs["frames"][0])["goal"]
        firsts = [np.asarray(self.proposal(obs), dtype=np.float32) for _ in range(self.candidates)]
        self._decisions += 1
        if self.goal is None or self.candidates == 1:  # nothing to score against: act as the proposal
            self.last_costs, self.last_candidates = [float("nan")] * len(firsts), [[c] for c in firsts]
            return firsts[0]
        scored = [self._imagine(chunk) for chunk in firsts]
        self.last_costs = [cost for cost, _ in scored]
        self.last_candidates = [chunks for _, chunks in scored]
        return firsts[int(np.argmin(self.last_costs))]

    def _imagine(self, first: np.ndarray) -> tuple[float, list[np.ndarray]]:
        """The candidate's cost and its chunks (from the first fork's continuation)."""
        import copy

        costs, finals, vanished, chunks0 = [], [], 0, []
        for f in range(self.forks):
            # fork 0 continues this env's noise; the others reseed it (a seed fixed by the episode and window)
            fork = fork_env(self.env, None if f == 0 else 1_000_003 * self._seed + 1_009 * self._decisions + f)
            continuation = copy.deepcopy(self.proposal)  # its own belief and noise, the same for every fork
            try:
                chunk, chunks, seen = first, [], {}
                for t in range(self.horizon):
                    if t:
                        chunk = np.asarray(continuation(seen), dtype=np.float32)
                    seen, *_ = fork.step(chunk)
                    chunks.append(chunk)
                    vanished += detect_objects(seen["frames"][-1])["block"] is None
                costs.append(self.objective(seen["frames"], self.goal))
                finals.append(detect_objects(seen["frames"][-1])["block"])
            finally:
                fork.close()
            if f == 0:
                chunks0 = chunks
        found = [b for b in finals if b is not None]
        spread = float(np.mean([np.linalg.norm(b - np.mean(found, axis=0)) for b in found])) if len(found) > 1 else 0.0
        cost = float(np.mean(costs)) + self.vanish_weight * vanished / (self.forks * self.horizon)
        return cost + self.disagreement_weight * spread, chunks0


OBSERVE = ("model", "simulator")


@dataclass
class ClosedLoopResult:
    """One closed-loop episode scored by the simulator: the common ``episode`` result (its ``success`` is the
    simulator's verdict on the executed chunks) and what the closed loop adds."""

    episode: EpisodeResult
    policy: str
    observe: str = "model"
    model_success: bool | None = None
    """success judged from the model's frames (what the agent believes; held for ``confirm_windows``
    windows); None when it saw the simulator"""
    actions: list[np.ndarray] = field(default_factory=list)
    stop: str = "max_windows"
    """why the episode ended: ``believed_success``, ``claimed_success`` (a ``stop_rule``'s signals passed too),
    ``sim_success`` (observe="simulator"), ``env_end`` (the env terminated or truncated) or ``max_windows``"""
    anchor_every: int | None = None
    cost_rank_correlation: list[float | None] = field(default_factory=list)
    """per window of a planner: Spearman between its imagined candidate costs and the same candidates'
    costs when their chunks are replayed in a copy of the simulator (None: undefined, e.g. equal costs)"""
    window_success: list[list[bool | None]] = field(default_factory=list)
    """per window: [the model's frames show success (None: observe="simulator"), the simulator has succeeded by
    then], so ``stopped_at`` can tell where any confirmation count would have stopped the same episode"""
    stop_rule_sha256: str | None = None
    """the ``SelectiveRule`` the episode stopped on (its hash; None: the streak alone)"""
    window_trust: list[dict[str, Any]] = field(default_factory=list)
    """per window, with a ``stop_rule``: the ``TrustSignals`` the rule read (as dicts)"""

    RECORD_KEYS = ("seed", "policy", "observe", "windows", "model_success", "sim_success", "actions", "stop",
                   "anchor_every", "cost_rank_correlation", "window_success", "stop_rule_sha256", "window_trust")
    """The fields of a planner episode's record (the fidelity report's ``planning.jsonl``), in order."""

    @property
    def sim_success(self) -> bool:
        """Success of the executed chunks in the simulator (what happened; the episode's ``success``)."""
        return self.episode.success

    def to_dict(self) -> dict[str, Any]:
        """The episode's fields and the closed loop's, flat (a summary JSON); actions as nested lists."""
        return {**self.episode.to_dict(), "policy": self.policy, "observe": self.observe,
                "model_success": self.model_success, "sim_success": self.sim_success,
                "actions": [np.asarray(a).tolist() for a in self.actions], "stop": self.stop,
                "anchor_every": self.anchor_every, "cost_rank_correlation": list(self.cost_rank_correlation),
                "window_success": [list(w) for w in self.window_success],
                "stop_rule_sha256": self.stop_rule_sha256, "window_trust": list(self.window_trust)}

    def to_record(self) -> dict[str, Any]:
        """The ``RECORD_KEYS`` of ``to_dict``."""
        flat = self.to_dict()
        return {k: flat[k] for k in self.RECORD_KEYS}

    @classmethod
    def from_record(cls, row: dict[str, Any], index: int = 0) -> ClosedLoopResult:
        """The result a ``to_record`` row describes (episode ``index`` of its run)."""
        episode = EpisodeResult(index=index, seed=row["seed"], windows=row["windows"], success=row["sim_success"])
        return cls(episode, row["policy"], row["observe"], row["model_success"], row["actions"], row["stop"],
                   row["anchor_every"], row["cost_rank_correlation"], row.get("window_success", []),
                   row.get("stop_rule_sha256"), row.get("window_trust", []))

    def stopped_at(self, confirm_windows: int) -> tuple[int, bool, bool]:
        """(windows, believed success, simulator success) of this model-loop episode had it stopped at
        ``confirm_windows`` consecutive windows of believed success. The loop's choices never depend on the
        count, so this equals a run with that count wherever this run went at least as far (a run with a larger
        count, or one that stopped no earlier); ValueError when it stopped before the answer is known."""
        check_int("confirm_windows", confirm_windows, 1)
        if self.observe != "model" or len(self.window_success) != self.episode.windows:
            raise ValueError(f"observe={self.observe!r} is invalid; allowed: a model-loop episode with its "
                             "window_success")
        streak = 0
        for w, (model, sim) in enumerate(self.window_success):
            streak = streak + 1 if model else 0
            if streak >= confirm_windows:
                return w + 1, True, bool(sim)
        if self.stop in ("believed_success", "claimed_success"):
            raise ValueError(f"confirm_windows={confirm_windows} is invalid for an episode that stopped at "
                             f"{self.episode.windows} windows on a streak shorter than that; allowed: <= the "
                             "count it ran with")
        return self.episode.windows, False, bool(self.window_success[-1][1]) if self.window_success else False


def closed_loop(env: gym.Env, policy: Policy, *, seed: int, max_windows: int = 16, observe: str = "model",
                simulator: gym.Env | None = None, video_path: str | os.PathLike | None = None,
                scale: int = 4, confirm_windows: int = 1, anchor_every: int | None = None,
                stop_rule: SelectiveRule | None = None, trained_horizon: int | None = None) -> ClosedLoopResult:
    """Run ``policy`` for one episode and judge it by the simulator (see the module docstring for ``observe``).

    The episode ends after ``max_windows`` windows, or when the agent's own frames have shown success in
    ``confirm_windows`` consecutive windows (a deployed agent stops when it believes it is done; the
    simulator's outcome never stops a model-loop episode, since the agent cannot see it), or, when the
    policy sees the simulator, when the simulator's frames show success. Success is
    ``PushSimEnv.success_from_frames`` with the goal of the simulator's first frame. With ``anchor_every``
    k (observe="model"), the world model restarts from the simulator's latest frame every k windows.
    ``env`` must reset to the simulator's scene (a model env with a ``simulator``, e.g. Pusher-v0);
    ``simulator`` defaults to a fresh ``PushSimEnv`` of the env's chunk size. The video shows what the
    policy saw (model frames, or the simulator's) next to the simulator. A planner's imagined candidate
    costs are compared per window with their costs replayed in a copy of the simulator.

    With a frozen ``stop_rule`` (a ``worldstep.trust.SelectiveRule``; observe="model"), the streak alone no longer
    stops the episode: the model's success is claimed, and the episode stops (``claimed_success``), only in a
    window where the streak has reached ``confirm_windows`` and every signal the rule uses passes: ``horizon``
    (windows since the model last started, from a reset or an anchor, over ``trained_horizon``), ``consistency``
    (``PushTracker``'s block residual from the model's own previous frame) and ``persistence`` (the streak).
    Each window's signals go to ``window_trust`` and the rule's hash to ``stop_rule_sha256``.
    """
    if getattr(env.unwrapped, "simulator", None) is None:
        raise ValueError("env is invalid; allowed: a world-model env made with a `simulator` "
                         "(config env.simulator, e.g. worldstep/Pusher-v0)")
    check_int("max_windows", max_windows, 1)
    check_int("confirm_windows", confirm_windows, 1)
    if anchor_every is not None:
        check_int("anchor_every", anchor_every, 1)
    if observe not in OBSERVE:
        raise ValueError(f"observe={observe!r} is invalid; allowed: one of {OBSERVE}")
    _check_stop_rule(stop_rule, trained_horizon, observe)
    if observe == "model" and judges_success(env):
        raise ValueError("env is invalid with observe='model': it judges success itself, so it would end the episode "
                         "at the first window whose frames show success, before confirm_windows can count; allowed: "
                         "an env made with success_fn='none' (the closed loop judges the streak)")
    if anchor_every is not None and observe != "model":
        raise ValueError(f"anchor_every={anchor_every!r} is invalid with observe={observe!r}; allowed: None "
                         "(the simulator loop re-anchors every window)")
    sim = simulator if simulator is not None else PushSimEnv(chunk_size=env.action_space.shape[0])
    start = time.perf_counter()
    result = ClosedLoopResult(EpisodeResult.of_env(env, seed=seed), getattr(policy, "name", type(policy).__name__),
                              observe=observe, anchor_every=anchor_every,
                              stop_rule_sha256=None if stop_rule is None else stop_rule.sha256)
    episode = result.episode
    policy.reset(seed)
    obs, info = env.reset(seed=seed)
    sim_obs, _ = sim.reset(seed=info.get("scene_seed", seed))
    first = sim_obs["frames"][0]
    streak, started, previous = 0, 0, _last_frame(obs, stop_rule)  # windows since the model (re)started; its frame
    if observe == "model":
        result.model_success = False
    with video_writer(video_path, frame_fps(env)) as writer:  # an exception leaves video_path as it was
        if writer is not None:
            writer.write(side_by_side(obs["frames"][:1], sim_obs["frames"][:1], scale))
            episode.video = str(writer.path)
        for window in range(max_windows):
            if observe == "simulator":
                if window:  # imagine from where the simulator is now
                    env.reset(options={"image": sim_obs["frames"][-1]})
                actions = policy(sim_obs)
            else:
                if window and anchor_every is not None and window % anchor_every == 0:
                    obs, _ = env.reset(options={"image": sim_obs["frames"][-1]})
                    started, previous = 0, _last_frame(obs, stop_rule)
                actions = policy(obs)
            result.cost_rank_correlation.extend(_cost_ranks(policy, sim, first))
            if observe == "model":
                obs, _, terminated, truncated, _ = env.step(actions)
            sim_obs, *_ = sim.step(actions)
            seen = obs["frames"] if observe == "model" else sim_obs["frames"]
            episode.windows += 1
            episode.frames += len(seen)
            if observe == "model":
                episode.terminated, episode.truncated = bool(terminated), bool(truncated)
            result.actions.append(np.asarray(actions, dtype=np.float32))
            episode.success = episode.success or bool(PushSimEnv.success_from_frames(first, sim_obs["frames"]))
            seen_success = None
            if observe == "model":
                seen_success = bool(PushSimEnv.success_from_frames(first, obs["frames"]))
                streak, started = streak + 1 if seen_success else 0, started + 1
                result.model_success = streak >= confirm_windows
                if stop_rule is not None:
                    trust = _window_signals(started, trained_horizon, previous, obs["frames"], actions, streak)
                    result.window_trust.append(trust.to_dict())
                    result.model_success = result.model_success and stop_rule.failing(trust) is None
                previous = _last_frame(obs, stop_rule)
            result.window_success.append([seen_success, result.sim_success])
            if writer is not None:
                writer.write(side_by_side(seen, sim_obs["frames"], scale))
            if result.model_success:
                result.stop = "believed_success" if stop_rule is None else "claimed_success"
            elif observe == "simulator" and result.sim_success:
                result.stop = "sim_success"
            elif observe == "model" and (terminated or truncated):
                result.stop = "env_end"
            if result.stop != "max_windows":
                break
    episode.finish(start)
    return result


def _check_stop_rule(stop_rule: SelectiveRule | None, trained_horizon: int | None, observe: str) -> None:
    """Refuse a rule the closed loop cannot apply, before any work (a signal it cannot measure never passes, so
    such a rule would silently never stop)."""
    if trained_horizon is not None:
        check_int("trained_horizon", trained_horizon, 1)
    if stop_rule is None:
        return
    if not isinstance(stop_rule, SelectiveRule):
        raise TypeError(f"stop_rule={stop_rule!r} is invalid; allowed: None or a worldstep.trust.SelectiveRule")
    if observe != "model":
        raise ValueError(f"stop_rule is invalid with observe={observe!r}; allowed: observe='model' (the "
                         "simulator loop stops on the simulator's success)")
    if stop_rule.agreement_min is not None:
        raise ValueError(f"stop_rule.agreement_min={stop_rule.agreement_min!r} is invalid here; allowed: None "
                         "(the closed loop measures horizon, consistency and persistence, not forks' agreement)")
    if stop_rule.horizon_max is not None and trained_horizon is None:
        raise ValueError("trained_horizon=None is invalid with stop_rule.horizon_max set; allowed: the model's "
                         "trained horizon in windows (`worldstep.trust.trained_horizon_for`)")


def _last_frame(obs: dict[str, np.ndarray], stop_rule: SelectiveRule | None) -> np.ndarray | None:
    """The frame the tracker steps from next window (only a stop rule reads it)."""
    return None if stop_rule is None else obs["frames"][-1]


def _window_signals(window: int, trained_horizon: int | None, previous: np.ndarray, frames: np.ndarray,
                    actions: np.ndarray, streak: int) -> TrustSignals:
    """The signals a stop rule reads for one model window (as `TrustSignalsWrapper` measures them)."""
    return TrustSignals(window=window, horizon=None if trained_horizon is None else window / trained_horizon,
                        consistency=PushTracker().residual(previous, frames, np.asarray(actions)),
                        persistence=streak)


def judges_success(env: gym.Env) -> bool:
    """Whether a ``JudgeSuccess`` in ``env``'s wrapper chain judges windows (and so may terminate on success)."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, JudgeSuccess) and env.judges:
            return True
        env = env.env
    return False


def _cost_ranks(policy: Policy, sim: gym.Env, first: np.ndarray) -> list[float | None]:
    """[Spearman of the planner's latest imagined costs vs the same candidates replayed in copies of `sim`],
    or [] for a policy that is not a planner."""
    import copy

    candidates, imagined = getattr(policy, "last_candidates", None), getattr(policy, "last_costs", None)
    if not candidates or len(candidates) < 2 or not np.all(np.isfinite(imagined)):
        return []
    goal = detect_objects(first)["goal"]
    true = []
    for chunks in candidates:
        replay = copy.deepcopy(sim)
        for chunk in chunks:
            seen, *_ = replay.step(chunk)
        true.append(policy.objective(seen["frames"], goal))
    rho = spearman(np.asarray(imagined), np.asarray(true))
    return [float(rho) if np.isfinite(rho) else None]
