"""The default first frame: a tabletop drawn from the env's RNG when no image is given."""

from __future__ import annotations

import numpy as np


def draw_tabletop(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """A dark table with a blue block and a red end-effector at positions drawn from ``rng``.

    Returns an ``(height, width, 3)`` uint8 frame. Only ``rng`` varies the frame, so the same
    generator state gives the same frame.
    """
    rows = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    frame = (np.array([18, 20, 26], np.float32) + rows * np.array([40, 36, 30], np.float32)).repeat(width, 1)
    size = max(2, min(height, width) // 8)
    for colour in ((40, 90, 220), (220, 40, 40)):  # block, then effector
        top = int(rng.integers(0, height - size))
        left = int(rng.integers(0, width - size))
        frame[top : top + size, left : left + size] = colour
    return frame.astype(np.uint8)


class SimulatorScene:
    """First frames from the ground-truth simulator a model was trained on.

    ``scene(seed, rng)`` resets the simulator (a gymnasium id whose observation is ``{"frames": ...}``) with
    ``seed``, or with a seed drawn from ``rng`` when ``seed`` is None, and returns its first frame; so a
    world-model env reset with seed ``s`` starts exactly where ``gym.make(env_id).reset(seed=s)`` starts,
    and the same actions can be replayed in both. The simulator is made on first use and kept.
    """

    def __init__(self, env_id: str) -> None:
        from gymnasium.envs.registration import registry

        if not isinstance(env_id, str) or env_id not in registry:
            raise ValueError(f"simulator={env_id!r} is invalid; allowed: a registered gymnasium id "
                             f"(e.g. 'worldstep/PushSim-v0')")
        self.env_id = env_id
        self._env = None

    def __call__(self, seed: int | None, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """(first frame, the simulator seed that reproduces it)."""
        seed = int(rng.integers(2**31)) if seed is None else int(seed)
        obs, _ = self._simulator().reset(seed=seed)
        if not isinstance(obs, dict) or "frames" not in obs:
            raise ValueError(f"simulator={self.env_id!r} is invalid; allowed: an env whose observation is "
                             f"{{'frames': (chunk, H, W, 3) uint8}}")
        return np.asarray(obs["frames"][0]), seed

    def success_judge(self):
        """The simulator's pixel judge ``success_from_frames(first_frame, frames) -> bool`` (None when it has
        none): success on world-model frames by the rule that scores the simulator's own frames."""
        return getattr(self._simulator().unwrapped, "success_from_frames", None)

    def _simulator(self):
        import gymnasium as gym

        if self._env is None:
            self._env = gym.make(self.env_id, disable_env_checker=True).unwrapped
        return self._env

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
