"""worldstep: drive an action-conditioned video world model like a simulator.

```python
import gymnasium as gym, worldstep
env = gym.make("worldstep/Tiny-v0")
obs, info = env.reset(seed=0, options={"prompt": "pick up the red cube", "domain_id": 8})
obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
```
"""

from __future__ import annotations

from importlib import metadata as _metadata

from . import world
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
from .registration import register_envs as register_envs
from .registration import register_when_gymnasium_loads
from .world import World, load, make_env

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
]


def __getattr__(name: str):
    """The names whose modules load gymnasium (and some torch), imported on first use: ``import worldstep.engine``
    runs this file first and must load neither, and gymnasium registers the ids only when it is imported
    (``registration``). Every import is spelled out, so tools and the structure test see each edge."""
    if name == "evaluate":
        from .evaluation.dispatch import evaluate

        return evaluate
    if name == "RemoteWorldModelEnv":
        from .serve.client import RemoteWorldModelEnv

        return RemoteWorldModelEnv
    if name == "planning":
        import worldstep.planning as planning  # (``from . import`` would ask this function again)

        return planning
    if name == "policies":
        import worldstep.policies as policies  # (``from . import`` would ask this function again)

        return policies
    if name == "truth":
        import worldstep.truth as truth  # (``from . import`` would ask this function again)

        return truth
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
