"""LeRobot's env type ``worldstep``: ``lerobot-eval --env.type=worldstep --env.discover_packages_path=
worldstep.lerobot_plugin`` runs a LeRobot policy in a ``worldstep serve`` world model (docs/lerobot.md).

Importing this package registers ``WorldstepEnvConfig`` with LeRobot's ``EnvConfig`` choices (lerobot 0.4.4) and
the gymnasium id it makes, ``worldstep/LeRobot-v0`` (``worldstep.lerobot.policy_env.LeRobotPolicyEnv``). It needs
lerobot, so it lives only in LeRobot's venv, where worldstep is installed without its dependencies
(``pip install --no-deps worldstep websockets msgpack pydantic pyyaml``): nothing here imports torch or
diffusers of worldstep's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.envs.configs import EnvConfig
from worldstep.envs.cameras import CameraGrid
from worldstep.lerobot.policy_env import PolicyEnvOptions

GYM_ID = "worldstep/LeRobot-v0"
if GYM_ID not in gym.registry:
    # no wrappers from gym.make: LeRobot reads `task` off the env it made (gymnasium's wrappers do not forward it);
    # the env refuses a step before reset itself
    gym.register(GYM_ID, entry_point="worldstep.lerobot.policy_env:LeRobotPolicyEnv", disable_env_checker=True,
                 order_enforce=False)


@EnvConfig.register_subclass("worldstep")
@dataclass
class WorldstepEnvConfig(EnvConfig):
    """The ``--env.*`` fields of ``--env.type=worldstep``. The frame size and action width are the served model's
    (the env refuses a server that differs); they fix the policy's features before any connection.

    ``task`` is the prompt (None: the server's); ``cameras`` a comma-separated list of LeRobot camera names;
    ``stats`` a LeRobot dataset folder whose ``meta/stats.json`` maps the policy's actions to the model's
    (``normalization``); the rest as ``worldstep.lerobot.policy_env.PolicyEnvOptions`` says.
    """

    url: str = "ws://127.0.0.1:8765"
    token_file: str | None = None
    cameras: str = "top"
    camera_layout: str = "row"
    frame_height: int = 64
    frame_width: int = 64
    action_width: int = 2
    robot_state: str = "none"
    stats: str | None = None
    normalization: str = "quantile"
    max_windows: int | None = None
    embodiment: str | None = None
    timeout_s: float = 120.0
    reconnect_s: float = 30.0
    record: str | None = None
    image: str | None = None
    fps: int = 24

    def __post_init__(self) -> None:
        self.options()  # bad fields are refused before LeRobot builds anything
        grid = CameraGrid(self.camera_names(), self.camera_layout, self.frame_height, self.frame_width)
        self.features = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(self.action_width,))}
        self.features_map = {"action": "action"}
        for name, (h, w) in grid.view_shapes().items():
            self.features[f"pixels/{name}"] = PolicyFeature(type=FeatureType.VISUAL, shape=(h, w, 3))
            self.features_map[f"pixels/{name}"] = f"observation.images.{name}"
        if self.robot_state != "none":
            self.features["agent_pos"] = PolicyFeature(type=FeatureType.STATE, shape=(self.action_width,))
            self.features_map["agent_pos"] = "observation.state"

    def camera_names(self) -> tuple[str, ...]:
        return tuple(name.strip() for name in self.cameras.split(",") if name.strip())

    def options(self) -> PolicyEnvOptions:
        return PolicyEnvOptions(cameras=self.camera_names(), camera_layout=self.camera_layout,
                                robot_state=self.robot_state, stats=self.stats, normalization=self.normalization,
                                max_windows=self.max_windows, task=self.task, embodiment=self.embodiment,
                                timeout_s=self.timeout_s, reconnect_s=self.reconnect_s, record=self.record,
                                image=self.image)

    @property
    def package_name(self) -> str:
        return __name__

    @property
    def gym_id(self) -> str:
        return GYM_ID

    @property
    def gym_kwargs(self) -> dict:
        token = None if self.token_file is None else Path(self.token_file).read_text().strip()
        return {"url": self.url, "token": token, "options": self.options(),
                "expect": (self.frame_height, self.frame_width, self.action_width)}
