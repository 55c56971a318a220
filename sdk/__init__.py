"""worldstep: drive an action-conditioned video world model like a simulator.

```python
import gymnasium as gym, worldstep
env = gym.make("worldstep/Tiny-v0")
obs, info = env.reset(seed=0, options={"prompt": "pick up the red cube", "domain_id": 8})
obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
```
"""

from importlib import metadata as _metadata

from .config import (
    CacheConfig,
    ConfigError,
    DecoderOptions,
    EnvConfig,
    ModelConfig,
    RolloutKnobs,
    WorldstepConfig,
    load_config,
)
from .episodes import EpisodeConfig
from .evaluate import evaluate
from .registration import register_envs
from .serve.client import RemoteWorldModelEnv
from .world import World, load, make_env

register_envs()

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
]
