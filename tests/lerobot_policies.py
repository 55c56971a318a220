"""Run in LeRobot's venv (not worldstep's): build a tiny random-weight policy with LeRobot's own config and
``save_pretrained``, or run ``lerobot-eval``.

    python lerobot_policies.py build DIR STATS.json act diffusion   # DIR/<kind>: policy and processors, no download
    python lerobot_policies.py eval ARGS...                        # LeRobot's `lerobot-eval ARGS...` entry point

The policies see one 64x64 camera (``observation.images.top``), a 2-wide ``observation.state`` and give 2-wide
actions, the pusher's; their processors normalise with the dataset's ``meta/stats.json`` (STATS.json), so they
act in the dataset's units. ``eval`` is the ``lerobot-eval`` console script's own ``main``, after the torchvision
schemas tests/lerobot_io.py explains (PyPI's torchvision is a CUDA build over the CPU torch here; ACT and
Diffusion Policy run no torchvision op).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

_lib = torch.library.Library("torchvision", "DEF")
for _op in ("nms", "qnms"):
    _lib.define(f"{_op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

from lerobot.configs.types import FeatureType, PolicyFeature  # noqa: E402
from lerobot.policies.factory import make_pre_post_processors  # noqa: E402

FEATURES_IN = {"observation.images.top": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 64, 64)),
               "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(2,))}
FEATURES_OUT = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(2,))}


def build(kind: str, out: Path, stats_file: Path) -> None:
    torch.manual_seed(0)
    common = {"input_features": FEATURES_IN, "output_features": FEATURES_OUT, "device": "cpu",
              "pretrained_backbone_weights": None, "push_to_hub": False}
    if kind == "act":  # one window per chunk: n_action_steps = the model's chunk (4)
        from lerobot.policies.act.configuration_act import ACTConfig
        from lerobot.policies.act.modeling_act import ACTPolicy

        config = ACTConfig(chunk_size=4, n_action_steps=4, dim_model=32, n_heads=2, dim_feedforward=64,
                           n_encoder_layers=1, n_decoder_layers=1, use_vae=False, **common)
        policy = ACTPolicy(config)
    else:
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
        from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

        config = DiffusionConfig(n_obs_steps=2, horizon=8, n_action_steps=4, down_dims=(16, 32), kernel_size=3,
                                 n_groups=4, diffusion_step_embed_dim=16, spatial_softmax_num_keypoints=8,
                                 crop_shape=None, num_train_timesteps=10, num_inference_steps=2,
                                 noise_scheduler_type="DDIM", **common)
        policy = DiffusionPolicy(config)
    raw = json.loads(stats_file.read_text())
    stats = {key: {name: torch.tensor(values, dtype=torch.float32) for name, values in raw[key].items()}
             for key in ("action", "observation.state")}
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)
    policy.save_pretrained(out)
    preprocessor.save_pretrained(out)
    postprocessor.save_pretrained(out)


if __name__ == "__main__":
    if sys.argv[1] == "build":
        for kind in sys.argv[4:]:
            build(kind, Path(sys.argv[2]) / kind, Path(sys.argv[3]))
    else:
        from lerobot.scripts.lerobot_eval import main

        sys.argv = ["lerobot-eval", *sys.argv[2:]]
        main()
