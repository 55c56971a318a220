"""A wrapper that tracks the robot state the actions command, for policies that condition on it."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from worldstep.engine.embodiment.action_convention import ActionConvention, ActionKind

from .pose import compose, matrix_to_rot6d, rot6d_to_matrix

IDENTITY_ROT6D = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)


class RobotStateObservation(gym.Wrapper):
    """Add ``obs["state"]``: the robot state the actions command, one row per frame of the window.

    This is the *commanded* state, computed from the actions by the embodiment's action convention
    (``Embodiment.convention``: absolute or delta, its layout and the source that says so). It is not read
    from the generated pixels: where the model's video drifts from the actions, the state does not follow.

    ``obs["state"]`` is ``(chunk_size, width)`` float32 in the action's own layout (``droid_lerobot``: position
    3, 6-D rotation 6, gripper 1); row ``i`` is the state after action row ``i``, the one frame ``i`` shows.
    After ``reset`` every row holds the initial state.

    - absolute convention: row ``i`` is action row ``i``;
    - delta convention: the pose is composed, ``T[i] = T[i-1] @ delta[i]`` (SE(3), the delta in the end
      effector's frame), with the delta's 6-D rotation re-orthonormalised by Gram-Schmidt and the pose kept as
      a rotation matrix (the 6-D rotation of a state is exact, never drifting); the gripper (a grasp state)
      and any other column are taken as commanded.

    ``reset(options={"state": ...})`` sets the initial state (``(width,)``, finite, a valid 6-D rotation, which
    is re-orthonormalised; a ``ValueError`` naming ``options['state']`` otherwise, before the env does any work);
    without it the
    state starts at ``initial_state``, by default the origin with the identity rotation and gripper 0. A
    window that ran out of KV pages executed no actions and leaves the state as it was.

    Args:
        env: a worldstep env (its ``unwrapped.conditioning.embodiment`` gives the convention).
        convention: overrides the embodiment's; None takes it. An embodiment whose convention is unknown
            offers no state: a ``ValueError`` naming it.
        initial_state: the state a reset without ``options["state"]`` starts from.
    """

    def __init__(self, env: gym.Env, convention: ActionConvention | None = None, *,
                 initial_state: np.ndarray | None = None) -> None:
        if not isinstance(env, gym.Env):
            raise TypeError(f"env={env!r} is invalid; allowed: a gymnasium.Env")
        if convention is None:
            embodiment = getattr(getattr(env.unwrapped, "conditioning", None), "embodiment", None)
            convention = None if embodiment is None else embodiment.convention
            if convention is None:
                name = None if embodiment is None else embodiment.name
                raise ValueError(f"embodiment {name!r} has no known action convention, so no robot state is "
                                 "offered; allowed: an embodiment with one (droid_lerobot, bridge_orig_lerobot, "
                                 "fractal, umi) or convention=ActionConvention(...)")
        if not isinstance(convention, ActionConvention):
            raise TypeError(f"convention={convention!r} is invalid; allowed: an ActionConvention or None")
        obs_space, act_space = env.observation_space, env.action_space
        if not (isinstance(obs_space, spaces.Dict) and isinstance(act_space, spaces.Box) and len(act_space.shape) == 2):
            raise TypeError(f"env spaces {obs_space}, {act_space} are invalid; allowed: a Dict observation and "
                            "(chunk, width) Box actions")
        if "state" in obs_space.spaces:
            raise ValueError("the env's observation already has a 'state' key; allowed: one RobotStateObservation")
        chunk, width = act_space.shape
        if convention.width != width:
            raise ValueError(f"convention width {convention.width} is invalid for actions {width} wide; allowed: "
                             f"a convention of width {width}")
        super().__init__(env)
        self.convention = convention
        self.initial_state = self._check_state(self._default_state() if initial_state is None else initial_state,
                                               "initial_state")
        self.observation_space = spaces.Dict(
            {**obs_space.spaces, "state": spaces.Box(-np.inf, np.inf, (chunk, width), np.float32)})
        self._state = self.initial_state.copy()  # float64 (width,), the latest commanded state
        self._rotation = self._rotation_of(self._state)  # [3, 3] exact rotation of a delta convention's pose

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        options = dict(options or {})
        state = options.pop("state", None)
        state = self.initial_state if state is None else self._check_state(state, "options['state']")
        obs, info = self.env.reset(seed=seed, options=options or None)
        self._state, self._rotation = state.copy(), self._rotation_of(state)
        chunk = self.action_space.shape[0]
        return {**obs, "state": np.repeat(state[None].astype(np.float32), chunk, axis=0)}, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if info.get("kv_exhausted", False):  # no window ran: nothing was executed
            rows = np.repeat(self._state[None], self.action_space.shape[0], axis=0)
        else:
            rows = np.stack([self._advance(row) for row in np.asarray(action, np.float64)])
        return {**obs, "state": rows.astype(np.float32)}, reward, terminated, truncated, info

    # --- the convention ------------------------------------------------------------------------

    def _advance(self, row: np.ndarray) -> np.ndarray:
        """Apply one action row; return the new state."""
        conv = self.convention
        if conv.kind is ActionKind.ABSOLUTE:
            self._state = row.copy()
            return self._state
        state = row.copy()  # the gripper and unlisted columns: as commanded
        pos = slice(*conv.position)
        d_rotation = np.eye(3) if conv.rotation is None else rot6d_to_matrix(row[slice(*conv.rotation)], "action")
        position, self._rotation = compose(self._state[pos], self._rotation, row[pos], d_rotation)
        state[pos] = position
        if conv.rotation is not None:
            state[slice(*conv.rotation)] = matrix_to_rot6d(self._rotation)
        self._state = state
        return state

    def _rotation_of(self, state: np.ndarray) -> np.ndarray:
        rot = self.convention.rotation
        return np.eye(3) if rot is None else rot6d_to_matrix(state[slice(*rot)])

    def _default_state(self) -> np.ndarray:
        state = np.zeros(self.convention.width)
        if self.convention.rotation is not None:
            state[slice(*self.convention.rotation)] = IDENTITY_ROT6D
        return state

    def _check_state(self, value: Any, field: str) -> np.ndarray:
        conv = self.convention
        layout = (f"position {list(range(*conv.position)) if conv.position else None}, rotation "
                  f"{list(range(*conv.rotation)) if conv.rotation else None}, gripper {conv.gripper}")
        try:
            state = np.asarray(value, np.float64)
        except (TypeError, ValueError):
            state = None
        if state is None or state.shape != (conv.width,):
            got = getattr(state, "shape", type(value).__name__)
            raise ValueError(f"{field} of shape {got} is invalid; allowed: shape ({conv.width},), the action's layout "
                             f"({layout})")
        if not np.all(np.isfinite(state)):
            raise ValueError(f"{field}={state.tolist()} is invalid; allowed: finite values")
        if conv.rotation is not None:  # a ValueError naming the field when it names no rotation
            state[slice(*conv.rotation)] = matrix_to_rot6d(rot6d_to_matrix(state[slice(*conv.rotation)], field))
        return state
