"""A judge that claims a success only where the rule's thresholds pass, and otherwise abstains, naming the signal.

`info["is_success"]` (and termination by success) is claimed only when the inner judge saw success and every
signal the rule uses passes; a success that fails sets `info["abstained"]` to the failing signal and the episode
goes on (so a success that must hold for k windows can be confirmed later). `info["judged_success"]` keeps the
inner judge's verdict, so nothing is hidden.
"""

from __future__ import annotations

import gymnasium as gym

from .rule import SelectiveRule
from .signals import TrustSignalsWrapper


class SelectiveJudge(gym.Wrapper):
    """Wraps a `TrustSignalsWrapper` (directly, or under wrappers that keep `info["trust"]`) with a frozen rule."""

    def __init__(self, env: gym.Env, rule: SelectiveRule) -> None:
        if not isinstance(rule, SelectiveRule):
            raise TypeError(f"rule={rule!r} is invalid; allowed: a SelectiveRule")
        inner = env
        while isinstance(inner, gym.Wrapper) and not isinstance(inner, TrustSignalsWrapper):
            inner = inner.env
        if not isinstance(inner, TrustSignalsWrapper):
            raise ValueError(f"env={env!r} is invalid; allowed: an env wrapped in TrustSignalsWrapper (the rule "
                             "reads info['trust'])")
        super().__init__(env)
        self.rule = rule

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        judged = bool(info.get("is_success", False))
        failing = self.rule.failing(info["trust"]) if judged else None
        claimed = judged and failing is None
        if judged and not claimed:
            terminated = False  # the inner judge ended it on a success this rule does not claim (reward kept)
        return obs, reward, terminated, truncated, {**info, "judged_success": judged, "is_success": claimed,
                                                    "abstained": failing}
