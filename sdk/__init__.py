"""worldstep: drive an action-conditioned video world model like a simulator.

```python
import gymnasium as gym, worldstep
env = gym.make("worldstep/Tiny-v0")
obs, info = env.reset(seed=0, options={"prompt": "pick up the red cube", "domain_id": 8})
obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
```
"""

from __future__ import annotations

import importlib
from importlib import metadata as _metadata

from .registration import register_when_gymnasium_loads

# Exported on first use, so that ``import worldstep.engine...`` (which runs this file first) loads neither
# gymnasium nor the envs; the structure test resolves this table like any import.
_EXPORTS = {
    "CacheConfig": ".config",
    "ConfigError": ".config",
    "DecoderOptions": ".config",
    "EnvConfig": ".config",
    "ModelConfig": ".config",
    "RolloutKnobs": ".config",
    "WorldstepConfig": ".config",
    "load_config": ".config",
    "EpisodeConfig": ".episodes",
    "evaluate": ".evaluation.dispatch",
    "RemoteWorldModelEnv": ".serve.client",
    "register_envs": ".registration",
    "World": ".world",
    "load": ".world",
    "make_env": ".world",
    # submodules users reach as attributes after `import worldstep` (worldstep.world.make_vec_env, ...)
    "world": ".world",
    "policies": ".policies",
    "planning": ".planning",
    "wrappers": ".wrappers",
    "truth": ".truth",
}

register_when_gymnasium_loads()

try:
    __version__ = _metadata.version("worldstep")
except _metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "CacheConfig",
    "ConfigError",
    "DecoderOptions",
    "EnvConfig",
    "EpisodeConfig",
    "ModelConfig",
    "RemoteWorldModelEnv",
    "RolloutKnobs",
    "World",
    "WorldstepConfig",
    "evaluate",
    "load",
    "load_config",
    "make_env",
    "planning",
    "policies",
    "truth",
    "world",
    "wrappers",
]


def __getattr__(name: str):
    if name in _EXPORTS:
        module = importlib.import_module(_EXPORTS[name], __name__)
        return module if _EXPORTS[name] == f".{name}" else getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

