"""Policies: observation in, one window's action chunk out. Everything worldstep calls a policy is in this package:

- ``builtin``: the :class:`Policy` protocol, the built-in policies (random, sine, replay, per-step, a function) and
  ``make_policy``, which builds one from a command-line spec;
- ``user``: a user's own policy named on the command line (``module:attr``, ``path/to/file.py:attr``);
- ``remote``: a policy served elsewhere over openpi's websocket protocol (``RemotePolicy``, ``PolicyClient``);
- ``server``: a small openpi-protocol ``PolicyServer`` for any ``obs -> {"actions": ...}`` function.

PushSim's scripted pixel policies are the simulator's task code and live beside it
(``worldstep.envs.push_policies``); ``make_policy("push", ...)`` builds one.
"""

from .builtin import (
    FunctionPolicy,
    PerStepPolicy,
    Policy,
    RandomPolicy,
    ReplayPolicy,
    SinePolicy,
    as_policy,
    make_policy,
)

__all__ = ["FunctionPolicy", "PerStepPolicy", "Policy", "RandomPolicy", "ReplayPolicy", "SinePolicy", "as_policy",
           "make_policy"]
