"""Gymnasium ids of worldstep: registered on ``import worldstep``.

``worldstep/Tiny-v0`` runs the embedded default (tiny random weights, built on first use);
``worldstep/Cosmos3Edge-v0`` runs the real Cosmos3-Edge checkpoint (``CheckpointNotFoundError`` names
where it looked when the weights are absent). Both take any ``worldstep.make_env`` keyword, e.g.
``gym.make("worldstep/Tiny-v0", max_windows=4, render_mode="rgb_array", model=world)``.
"""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

# id -> (config name, max_episode_steps = the config's env.max_windows)
ENV_IDS = {
    "worldstep/Tiny-v0": ("tiny", 32),
    "worldstep/Cosmos3Edge-v0": ("cosmos3_edge", 64),
}


def register_envs() -> None:
    """Register every worldstep id once (safe to call again)."""
    for env_id, (config, max_steps) in ENV_IDS.items():
        if env_id in registry:
            continue
        register(
            id=env_id,
            entry_point="worldstep.world:make_env",
            vector_entry_point="worldstep.world:make_vec_env",
            max_episode_steps=max_steps,
            kwargs={"model": config},
        )
