"""What the model-loading commands share: the model flags, the config they resolve to, the policy when the config
gives its shape, and the summary's record of the run; nothing here loads a model."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..flags import add_flags, flag
from ..registration import WORLD_MODEL_IDS
from .checks import check_image_flag, parse_set, success_name

DEFAULT_ENV = "worldstep/Tiny-v0"

POLICY_HELP = ("sine, random, push (PushSim's pixel expert), replay:PATH.npy, or your own: module:attr or "
               "path/to/file.py:attr (a policy, a function obs -> actions, or a class built with the action shape)")
SUCCESS_HELP = ("success judge of each window: sim (the config's simulator's pixel judge; the default when the "
                "config names a simulator), none, or module:function (frames -> bool)")


@dataclass
class ModelFlags:
    """Which model, on which device, with which config overrides."""

    env: str = flag("registered env id whose config to use", default=DEFAULT_ENV, choices=sorted(WORLD_MODEL_IDS),
                    exclusive="model")
    config: str | None = flag("config name (tiny, pusher, cosmos3_edge), .yaml path, checkpoint folder or hub id",
                              default=None, exclusive="model")
    device: str | None = flag("auto, cpu, cuda or cuda:N (default: the config's)", default=None)
    set: list[str] = flag("override any config key, e.g. --set num_steps=2 or --set rollout.num_steps=2 "
                          "(repeatable)", default_factory=list, repeat=True, metavar="KEY=VALUE")


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, ModelFlags)


def model_and_overrides(args: argparse.Namespace, **extra: Any) -> tuple[str, dict[str, Any]]:
    model = args.config or WORLD_MODEL_IDS[args.env]
    overrides = parse_set(args.set)
    for key in ("device", "prompt", "embodiment", "domain_id", "image", "context_frames"):
        value = getattr(args, key, None)
        if value is not None:
            overrides[key] = value
    overrides.update({k: v for k, v in extra.items() if v is not None})
    return model, overrides


def prepare(args: argparse.Namespace, **extra: Any):
    """(model, config): the config with every override applied and checked, the device and the first-frame
    image checked; no model is loaded. Commands hand the config itself to the SDK."""
    from ..world import check_device, resolve_config

    model, overrides = model_and_overrides(args, **extra)
    config = resolve_config(model).with_overrides(**overrides)
    if config.model.device != "auto":
        check_device(config.model.device)
    check_image_flag(getattr(args, "image", None))
    return model, config


def run_info(args: argparse.Namespace, model: str, config) -> dict[str, Any]:
    """What a summary records about the run: enough to repeat it."""
    return {"command": args.command, "env": args.env if args.config is None else None, "config": model,
            "policy": args.policy, "seed": args.seed, "prompt": config.env.prompt, "domain_id": config.env.domain_id,
            "embodiment": config.env.embodiment,
            "image": getattr(args, "image", None), "success_judge": success_name(args.success, config),
            "set": parse_set(args.set)}


def early_policy(args: argparse.Namespace, config):
    """The policy when the action shape can be read from the config (checks replay files and ``push``'s
    width before loading); None when only the loaded model knows the shape."""
    from ..evaluation.distributed import action_shape
    from ..policies import make_policy

    shape = action_shape(config)
    return None if shape is None else make_policy(args.policy, shape, seed=args.seed)


def check_lerobot_out(path: str | None) -> None:
    if path is not None and Path(path).exists():
        raise ValueError(f"--lerobot-out={path!r} is invalid: it exists; allowed: a folder that does not exist yet")


def summary_file(args: argparse.Namespace) -> Path:
    """``--summary``, default ``--out`` with ``.json``; both checked as files to write."""
    from ..outputs import check_output_path

    out = check_output_path(args.out, "--out")
    return check_output_path(args.summary if args.summary else out.with_suffix(".json"), "--summary")
