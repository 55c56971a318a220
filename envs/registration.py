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
    "worldstep/Pusher-v0": ("pusher", 16),  # trained on PushSim-v0; reset with options={"image": first_frame(rng)}
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
    if "worldstep/PushSim-v0" not in registry:  # the ground-truth simulator the pusher model was trained on
        register(id="worldstep/PushSim-v0", entry_point="worldstep.envs.push_sim:PushSimEnv", max_episode_steps=16,
                 kwargs={"chunk_size": 4})
