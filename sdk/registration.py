"""Gymnasium ids of worldstep, registered in one place, by ``import worldstep``: at once when gymnasium is loaded,
else the moment it is (``register_when_gymnasium_loads``). Gymnasium 1.x reads no plugin entry points (0.x's
``gymnasium.envs`` group is gone), so the package's own import is the one way in.

| id | config | what it is |
|---|---|---|
| ``worldstep/Tiny-v0`` | ``tiny`` | the embedded default: tiny random weights, built on first use |
| ``worldstep/Pusher-v0`` | ``pusher`` | a small Cosmos3 model trained on PushSim, shipped as package data |
| ``worldstep/Cosmos3Edge-v0`` | ``cosmos3_edge`` | NVIDIA Cosmos3-Edge (weights: a folder or the hub cache) |
| ``worldstep/Cosmos3Nano-v0`` | ``cosmos3_nano`` | NVIDIA Cosmos3-Nano (weights: a folder or the hub cache) |
| ``worldstep/PushSim-v0`` | -- | the procedural simulator the pusher model was trained on |
| ``worldstep/Remote-v0`` | -- | an env of a ``worldstep serve`` process: ``gym.make(id, url=..., token=...)`` |

Every world-model id takes any ``worldstep.make_env`` keyword (``max_windows=4``, ``model=world`` to share a
loaded model, ``render_mode="rgb_array"``, ...); ``max_episode_steps`` is the config's ``env.max_windows``, and
gymnasium's ``TimeLimit`` is the one counter of windows (``worldstep.world.make_registered_env``).
Without their weights (a folder, or the offline hub cache) the real models raise `CheckpointNotFoundError`
naming every place they looked.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

WORLD_MODEL_IDS = {
    "worldstep/Tiny-v0": "tiny",
    "worldstep/Pusher-v0": "pusher",
    "worldstep/Cosmos3Edge-v0": "cosmos3_edge",
    "worldstep/Cosmos3Nano-v0": "cosmos3_nano",
}
SIMULATOR_IDS = {"worldstep/PushSim-v0": "worldstep.envs.push_sim:PushSimEnv"}
REMOTE_IDS = {"worldstep/Remote-v0": "worldstep.serve.client:RemoteWorldModelEnv"}


class RegisteredEnv:
    """The entry point ``gym.make`` calls for the world-model id of ``config``: it knows which config the id's
    ``max_episode_steps`` came from (``worldstep.world.make_registered_env``). A callable, as gymnasium allows
    (``spec.to_json()`` then refuses it, as it refuses every callable entry point)."""

    def __init__(self, config: str) -> None:
        self.config = config

    def __repr__(self) -> str:
        return f"RegisteredEnv({self.config!r})"

    def __call__(self, **kwargs: Any):
        from .world import make_registered_env

        return make_registered_env(self.config, **kwargs)


def register_envs() -> None:
    """Register every worldstep id once (safe to call again)."""
    from gymnasium.envs.registration import register, registry

    from .config import shipped_env_section

    for env_id, config in WORLD_MODEL_IDS.items():
        if env_id not in registry:
            register(id=env_id, entry_point=RegisteredEnv(config), vector_entry_point="worldstep.world:make_vec_env",
                     max_episode_steps=shipped_env_section(config).max_windows, kwargs={"model": config})
    for env_id, entry_point in SIMULATOR_IDS.items():
        if env_id not in registry:
            register(id=env_id, entry_point=entry_point, max_episode_steps=16, kwargs={"chunk_size": 4})
    for env_id, entry_point in REMOTE_IDS.items():  # the server's env truncates at its own max_windows
        if env_id not in registry:
            register(id=env_id, entry_point=entry_point)


def register_when_gymnasium_loads() -> None:
    """Register now when gymnasium is loaded, else right after it is: ``import worldstep`` (which every
    ``import worldstep.engine...`` runs first) loads no gymnasium, and ``gym.make("worldstep/...")`` still finds
    the ids in either import order."""
    if "gymnasium" in sys.modules:
        register_envs()
    elif not any(isinstance(f, _AfterGymnasiumImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterGymnasiumImport())


class _AfterGymnasiumImport(importlib.abc.MetaPathFinder):
    """An import hook that runs `register_envs` once the ``gymnasium`` package has been executed, then leaves.

    It stays until gymnasium is loaded, not merely looked up (``importlib.util.find_spec("gymnasium")``, which
    torchrl and others call, finds without loading)."""

    def find_spec(self, name, path, target=None):
        if name != "gymnasium":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module) -> None:
            execute(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            register_envs()

        spec.loader.exec_module = exec_module
        return spec
