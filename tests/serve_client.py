"""A client process of the serve tests: ``python serve_client.py URL TOKEN SEED STEPS OUT [GO_FILE [CLOSE_FILE]]``.

Opens a RemoteWorldModelEnv, resets with SEED, writes OUT.ready, waits for GO_FILE (when given), steps
``serve_actions(space, k)`` STEPS times (STEPS < 0: forever) and saves every window's frames to OUT (.npy). With
CLOSE_FILE it then writes the server's ``status`` of its session to OUT.status.json and waits for CLOSE_FILE
before closing. Any attempt to load a model in this process raises.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np


def serve_actions(shape: tuple[int, ...], k: int) -> np.ndarray:
    """The k-th action chunk of a client: deterministic, different per window, inside [-1, 1]."""
    return (0.8 * np.sin(k + np.linspace(0, 3, int(np.prod(shape))))).reshape(shape).astype(np.float32)


def forbid_model_loading() -> None:
    """In a child process (a client, an RL library's worker), make any model load raise. The parent (a test
    process; torchrl builds one env there to read its specs) is left as it is."""
    import multiprocessing

    import worldstep.world

    if multiprocessing.parent_process() is None and __name__ != "__main__":
        return

    def refuse(*args, **kwargs):
        raise AssertionError("a client process loaded a world model")

    worldstep.world._load_model = refuse


def main(url: str, token: str, seed: int, steps: int, out: Path, go: Path | None = None,
         close: Path | None = None) -> None:
    import worldstep

    forbid_model_loading()
    env = worldstep.RemoteWorldModelEnv(url, token=token or None, max_windows=64)
    obs, _ = env.reset(seed=seed)
    frames = [obs["frames"]]
    out.with_suffix(".ready").touch()
    while go is not None and not go.exists():
        time.sleep(0.01)
    k = 0
    while steps < 0 or k < steps:
        frames.append(env.step(serve_actions(env.action_space.shape, k))[0]["frames"])
        k += 1
    np.save(out, np.stack(frames))
    if close is not None:
        out.with_suffix(".status.json").write_text(json.dumps(env.status()))
        while not close.exists():
            time.sleep(0.01)
    env.close()


if __name__ == "__main__":
    url, token, seed, steps, out = sys.argv[1:6]
    main(url, token, int(seed), int(steps), Path(out), *(Path(arg) for arg in sys.argv[6:8]))


def remote_image_env(url: str, token: str):
    """A SubprocVecEnv worker's env: the served env as an image, in a process that may not load a model."""
    import gymnasium as gym
    import worldstep  # noqa: F401 - registers the ids in the worker
    from worldstep.envs import ImageObservation

    forbid_model_loading()
    return ImageObservation(gym.make("worldstep/Remote-v0", url=url, token=token, max_windows=8), "stack")


def remote_torchrl_env(url: str, token: str):
    """A torchrl ParallelEnv worker's env, in a process that may not load a model."""
    import worldstep  # noqa: F401 - registers the ids in the worker
    from torchrl.envs import GymEnv

    forbid_model_loading()
    return GymEnv("worldstep/Remote-v0", url=url, token=token, max_windows=8)
