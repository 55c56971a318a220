"""The front door: ``load`` a world model from a name, YAML, checkpoint folder or hub id; ``make_env``."""

from __future__ import annotations

import functools
import json
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .config import CONFIG_NAMES, ConfigError, WorldstepConfig, check_override_keys, load_config

# Models loaded with `load(..., share=True)`, by their (model, cache, decoder) sections; an entry goes when
# the last World holding it does. `load` without `share` never looks here.
_SHARED: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()

_ENV_RUNTIME_KEYS = ("render_mode", "reward_fn", "success_fn", "fps", "action_normalizer")


@dataclass(frozen=True, eq=False)
class World:
    """A loaded world model and the config it was loaded with.

    ``model`` is the engine's ``Cosmos3WorldModel`` (``spec``, ``kv``, ``decoder``, ``open_session``,
    ``step``, ``fork``, ``close``). A World is a handle to one loaded model and its page pool: pass it around
    (``make_env(world)``, ``gym.make(id, model=world)``) to share them; copying it copies the handle.
    """

    model: Any
    config: WorldstepConfig

    @property
    def spec(self):
        """The engine's ``ModelSpec``: height, width, fps, action_dim, num_domains, ..."""
        return self.model.spec

    @property
    def knobs(self):
        """The rollout knobs of this world's sessions (``config.rollout``, the engine's ``RolloutKnobs``)."""
        return self.config.rollout

    @functools.cached_property
    def conditioning(self):
        """The engine's ``Conditioning`` of this world's envs (their config's embodiment), resolved once."""
        env = self.config.env
        return self.model.conditioning(self.knobs, env_rule=True, embodiment=env.embodiment,
                                       domain_id=env.domain_id, action_width=env.action_width)

    @property
    def action_shape(self) -> tuple[int, int]:
        """``(chunk_size, action_width)`` of this world's envs."""
        return self.config.rollout.chunk_size, self.conditioning.action_width

    def __deepcopy__(self, memo: dict) -> World:
        return self

    def __repr__(self) -> str:
        spec = self.model.spec
        return (f"World(name={self.config.model.name!r}, {spec.height}x{spec.width}@{spec.fps:g}fps, "
                f"device={self.model.device}, chunk_size={self.config.rollout.chunk_size})")


def resolve_config(model: str | os.PathLike | WorldstepConfig | World) -> WorldstepConfig:
    """The config for a shipped name, a YAML path, a checkpoint folder or a hub id."""
    if isinstance(model, World):
        return model.config
    if isinstance(model, WorldstepConfig):
        return model
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model={model!r} is invalid; allowed: a config name, a .yaml path, a checkpoint folder, "
                        "a hub id, a WorldstepConfig or a World")
    text = str(model)
    if text.replace("-", "_").lower() in CONFIG_NAMES or text.endswith((".yaml", ".yml")):
        return load_config(text)
    local = Path(text).expanduser()
    is_hub_id = text.count("/") == 1 and not text.startswith((".", "/", "~")) and not local.exists()
    if not local.exists() and not is_hub_id and (text.startswith((".", "/", "~")) or os.sep in text):
        raise FileNotFoundError(f"checkpoint folder {text!r} does not exist")
    if local.is_dir() or is_hub_id:
        # A real checkpoint: the run settings of the config its worldstep.json names (a checkpoint that
        # `worldstep train` wrote says "pusher"), else Cosmos3-Edge's; this checkpoint's weights and media size.
        base = load_config(_base_config_name(local))
        name = local.name if local.is_dir() else text.split("/")[-1]
        section = {"name": name, "checkpoint": str(local if local.is_dir() else text), "architecture": None}
        return base.with_overrides(model=section)
    raise ConfigError(f"model = {text!r}: must be one of {CONFIG_NAMES}, a .yaml path, a checkpoint folder "
                      "(transformer/, vae/, scheduler/, text_tokenizer/) or a hub id 'owner/name'")


def _base_config_name(folder: Path) -> str:
    """`config` of the folder's worldstep.json when it names a shipped config; `cosmos3_edge` otherwise."""
    meta_path = folder / "worldstep.json"
    if not folder.is_dir() or not meta_path.is_file():
        return "cosmos3_edge"
    name = json.loads(meta_path.read_text()).get("config")
    if name is None:
        return "cosmos3_edge"
    if name not in CONFIG_NAMES:
        raise ConfigError(f"{meta_path}: config = {name!r}: must be one of {CONFIG_NAMES}")
    return name


def load(model: str | os.PathLike | WorldstepConfig | World = "tiny", device: str | None = None,
         dtype: str | None = None, *, share: bool = False, **overrides: Any) -> World:
    """Load a world model.

    Args:
        model: ``"tiny"`` (the embedded default: tiny random weights, built on first use into
            ``$WORLDSTEP_CACHE``), ``"cosmos3_edge"``, a config ``.yaml``, a diffusers-layout checkpoint
            folder, a hub id available offline, a ``WorldstepConfig`` or a ``World``.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (None: the config's).
        dtype: ``float32``, ``bfloat16`` or ``float16`` (None: the config's).
        share: reuse a model this process loaded with ``share=True`` and the same model, cache and decoder
            sections (sessions stay independent; they share the weights and the page pool). Without it every
            call loads its own model; pass a ``World`` around to share one explicitly. Rollout and env
            overrides of a ``World`` never reload it.
        **overrides: config keys by section (``rollout={"num_steps": 2}``), dotted (``**{"decoder.dtype":
            "bfloat16"}``) or by field name (``num_steps=2``, ``num_pages=64``); a key given as None keeps the
            config's value; unknown keys raise ``ConfigError``.
    """
    overrides = given(overrides)
    if device is not None:
        overrides["device"] = device
    if dtype is not None:
        overrides["dtype"] = dtype
    if not isinstance(share, bool):
        raise ValueError(f"share={share!r} is invalid; allowed: True or False")
    config = resolve_config(model)
    if overrides:
        config = config.with_overrides(**overrides)
    if isinstance(model, World) and _same_model(model.config, config):
        return World(model=model.model, config=config)
    return World(model=_load_model(config, share), config=config)


def _same_model(a: WorldstepConfig, b: WorldstepConfig) -> bool:
    return (a.model, a.cache, a.decoder) == (b.model, b.cache, b.decoder)


def embedded_checkpoint(name: str, architecture: dict) -> Path:
    """Trained weights shipped as package data (`worldstep/configs/models/NAME/`, e.g. `pusher`) when
    present; otherwise a random-weight checkpoint built once from `architecture` (e.g. `tiny`)."""
    from importlib.resources import files

    from worldstep.engine.models.cosmos3.checkpoint import ensure_embedded_checkpoint

    shipped = Path(str(files("worldstep.configs") / "models" / name))
    if (shipped / "model_index.json").is_file():
        return shipped
    return ensure_embedded_checkpoint(name, architecture)


def _load_model(config: WorldstepConfig, share: bool):
    import torch
    from worldstep.engine.devices import resolve_device
    from worldstep.engine.models.cosmos3.loader import load_components
    from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel

    m = config.model
    check_device(m.device)
    device = resolve_device(m.device, name="model.device")  # once: one model per device, however it is spelled
    key = json.dumps([{**m.model_dump(mode="json"), "device": str(device)}, config.cache.model_dump(),
                      config.decoder.model_dump()], sort_keys=True)
    model = _SHARED.get(key) if share else None
    if model is not None:
        return model
    path = m.checkpoint if m.embedded_name is None else embedded_checkpoint(m.embedded_name, m.architecture)
    components = load_components(path, device=device, dtype=None if m.dtype is None else getattr(torch, m.dtype))
    # the config's sections are the engine's: the model section is its RuntimeConfig
    model = Cosmos3WorldModel(components, device=device, cache=config.cache, decoder=config.decoder, runtime=m)
    if share:
        _SHARED[key] = model
    return model


def check_device(device: str) -> None:
    """ValueError naming ``model.device`` when it names a CUDA device this machine does not have."""
    import torch

    if not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise ValueError(f"model.device = {device!r}: CUDA is not available on this machine (torch "
                         f"{torch.__version__}); allowed: 'auto' or 'cpu'")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise ValueError(f"model.device = {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                         f"allowed: 'cuda:0' .. 'cuda:{torch.cuda.device_count() - 1}', 'auto' or 'cpu'")


def _split_env_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(env-only kwargs: render_mode, reward_fn, success_fn and an image array, config overrides)."""
    runtime = {k: kwargs.pop(k) for k in _ENV_RUNTIME_KEYS if k in kwargs}
    if isinstance(kwargs.get("image"), np.ndarray):
        runtime["image"] = kwargs.pop("image")
    return runtime, kwargs


def given(overrides: dict[str, Any]) -> dict[str, Any]:
    """The keyword overrides that say something: a key given as None means the config's default (a script passes
    its optional flags straight through); a section mapping sets None explicitly (``env={"domain_id": None}``).
    Every key is checked, None or not."""
    check_override_keys(overrides)
    return {k: v for k, v in overrides.items() if v is not None}


def _sets_max_windows(overrides: dict[str, Any]) -> bool:
    """Whether the overrides give ``env.max_windows`` in any of their forms."""
    env = overrides.get("env")
    return ("max_windows" in overrides or "env.max_windows" in overrides
            or (isinstance(env, dict) and "max_windows" in env))


def _env_kwargs(world: World, runtime: dict[str, Any]) -> dict[str, Any]:
    env = world.config.env
    image = runtime.pop("image", None)
    if image is None and env.image is not None:
        image = read_image(env.image)
    return dict(max_windows=env.max_windows, prompt=env.prompt, domain_id=env.domain_id, image=image,
                action_width=env.action_width, embodiment=env.embodiment, resolution_tier=env.resolution_tier,
                simulator=env.simulator, observation=env.observation, **runtime)


def make_env(model: str | os.PathLike | WorldstepConfig | World = "tiny", **kwargs: Any):
    """A :class:`worldstep.envs.WorldModelEnv` for ``model`` (anything :func:`load` takes), in the wrappers its
    config and ``kwargs`` ask for: ``WindowLimit(JudgeSuccess(NormalizeActions(env)))`` (``NormalizeActions``
    only with an ``action_normalizer``; see ``worldstep.envs.wrappers.episode``). The env itself is
    ``env.unwrapped``; ``worldstep.envs.fork_env(env)`` forks it inside its wrappers.

    ``kwargs``: ``render_mode``, ``image`` (an ``(H, W, 3)`` uint8 array or a path) and ``fps`` (see
    ``WorldModelEnv``), ``success_fn`` and ``reward_fn`` (``JudgeSuccess``), ``action_normalizer``
    (``NormalizeActions``), and any config key (``max_windows=4`` for ``WindowLimit``, ``prompt=...``,
    ``embodiment="droid_lerobot"``, ``domain_id=8``, ``num_steps=2``, ...).
    ``cameras=("exterior", "wrist")`` (with ``camera_layout``, default ``"row"``, ``view_point`` defaulting to
    ``"concat_view"``, and ``image`` a dict of first views) wraps it in ``MultiCameraObservation``;
    ``robot_state=True`` in ``RobotStateObservation`` (docs/observations.md).
    ``trust=True`` (or a dict of its keyword arguments, e.g. ``{"tracker": PushTracker()}``) wraps it last in
    ``worldstep.trust.TrustSignalsWrapper``, whose ``trained_horizon`` defaults to the model's
    (``worldstep.trust.trained_horizon_for``: the config's ``model.trained_horizon``, else the checkpoint's).
    ``gym.make("worldstep/Tiny-v0", **kwargs)`` adds gymnasium's own wrappers around it (`make_registered_env`).
    """
    return _make_env(model, kwargs, registered_windows=None)


def make_registered_env(registered: str, **kwargs: Any):
    """What ``gym.make`` builds for the id registered for config ``registered``: `make_env`, with the window limit
    counted once.

    ``gym.make`` wraps the env in gymnasium's ``TimeLimit`` (``max_episode_steps``: the registered config's
    ``env.max_windows``, or the value passed to it), so the env adds no ``WindowLimit`` of its own and
    ``gym.make(id, max_episode_steps=N)`` runs N windows. When ``kwargs`` ask for another limit than the registered
    one (``max_windows=4``, or a ``model`` whose config has another ``env.max_windows``), the env keeps a
    ``WindowLimit`` of that many windows inside the ``TimeLimit`` (which then truncates at the smaller of the two);
    so does an explicit ``max_windows`` equal to the registered limit.
    """
    from .config import shipped_env_section

    return _make_env(kwargs.pop("model", registered), kwargs,
                     registered_windows=shipped_env_section(registered).max_windows)


def _make_env(model: str | os.PathLike | WorldstepConfig | World, kwargs: dict[str, Any],
              registered_windows: int | None):
    """`make_env`; ``registered_windows``: the limit of the id ``gym.make`` builds this for (its ``TimeLimit``
    counts the windows unless ``max_windows`` is given, or the config's differs)."""
    from worldstep.envs import MultiCameraObservation, RobotStateObservation
    from worldstep.envs.make import make_world_model_env

    kwargs = dict(kwargs)
    cameras, layout = kwargs.pop("cameras", None), kwargs.pop("camera_layout", None)
    robot_state = kwargs.pop("robot_state", False)
    trust = _trust_kwargs(kwargs.pop("trust", None))
    if not isinstance(robot_state, bool):
        raise ValueError(f"robot_state={robot_state!r} is invalid; allowed: True or False")
    if cameras is None and layout is not None:
        raise ValueError(f"camera_layout={layout!r} is invalid without cameras; allowed: cameras=(...) with it")
    views = kwargs.pop("image") if cameras is not None and isinstance(kwargs.get("image"), Mapping) else None
    if cameras is not None:
        kwargs.setdefault("view_point", "concat_view")  # the caption frames several cameras
    runtime, overrides = _split_env_kwargs(kwargs)
    world = load(model, **overrides)
    env_kwargs = _env_kwargs(world, runtime)
    if not _sets_max_windows(overrides) and env_kwargs["max_windows"] == registered_windows:
        env_kwargs["max_windows"] = None  # counted by gym.make's TimeLimit alone
    env = make_world_model_env(world.model, world.knobs, **env_kwargs)
    if robot_state:
        env = RobotStateObservation(env)
    if cameras is not None:
        env = MultiCameraObservation(env, cameras, "row" if layout is None else layout, images=views)
    return env if trust is None else _with_trust(env, world, trust)


def _trust_kwargs(trust: Any) -> dict[str, Any] | None:
    """`make_env`'s ``trust``: None/False (no signals), True (defaults) or a dict of `TrustSignalsWrapper` kwargs."""
    if trust is None or trust is False:
        return None
    if trust is True:
        return {}
    if not isinstance(trust, Mapping):
        raise ValueError(f"trust={trust!r} is invalid; allowed: True, False, None or a dict of TrustSignalsWrapper "
                         "keyword arguments (trained_horizon, tracker, agreement_forks, seed)")
    return dict(trust)


def _with_trust(env, world: World, trust: dict[str, Any]):
    """`env` in the trust wrapper of its kind (one env or a vector env), closed if the wrapper refuses."""
    import gymnasium as gym

    from .trust import TrustSignalsVectorWrapper, TrustSignalsWrapper, trained_horizon_for

    if world.config.env.observation != "frames":
        env.close()
        raise ValueError(f"trust is invalid with observation={world.config.env.observation!r}; allowed: "
                         "observation='frames' (the signals read the decoded frames)")
    trust.setdefault("trained_horizon", trained_horizon_for(world))
    try:
        wrapper = TrustSignalsVectorWrapper if isinstance(env, gym.vector.VectorEnv) else TrustSignalsWrapper
        return wrapper(env, **trust)
    except Exception:
        env.close()
        raise


def make_vec_env(model: str | os.PathLike | WorldstepConfig | World = "tiny", num_envs: int = 1,
                 max_episode_steps: int | None = None, **kwargs: Any):
    """A :class:`worldstep.envs.WorldModelVectorEnv` of ``num_envs`` episodes batched through one model.

    ``gym.make_vec(id, num_envs=N, vectorization_mode="vector_entry_point")`` calls this;
    ``max_episode_steps`` (from the registration) caps ``max_windows``. ``autoreset_mode``: ``"next_step"``
    (default), ``"same_step"`` or ``"disabled"`` (see ``WorldModelVectorEnv``; torchrl takes the last two).
    ``trust=True`` (or a dict of its keyword arguments) wraps it in ``worldstep.trust.TrustSignalsVectorWrapper``,
    its ``trained_horizon`` the model's, as `make_env` does.
    """
    from worldstep.envs import WorldModelVectorEnv
    from worldstep.envs.vector_env import check_autoreset_mode

    kwargs = dict(kwargs)
    mode = check_autoreset_mode(kwargs.pop("autoreset_mode", "next_step"))  # before the model loads
    trust = _trust_kwargs(kwargs.pop("trust", None))
    runtime, overrides = _split_env_kwargs(kwargs)
    if max_episode_steps is not None and not _sets_max_windows(overrides):
        overrides["max_windows"] = max_episode_steps
    world = load(model, **overrides)
    env = WorldModelVectorEnv(world.model, num_envs, world.knobs, autoreset_mode=mode, **_env_kwargs(world, runtime))
    return env if trust is None else _with_trust(env, world, trust)


def read_image(path: str | os.PathLike) -> np.ndarray:
    """An image file as an ``(H, W, 3)`` uint8 array (PNG, JPEG, ... via Pillow; ``.npy`` via numpy)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image {str(path)!r} does not exist")
    from PIL import Image, UnidentifiedImageError

    try:
        if path.suffix == ".npy":
            return np.load(path)
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"))
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise ValueError(f"image {str(path)!r} is invalid: it cannot be read ({type(err).__name__}: {err}); "
                         "allowed: an image file Pillow reads (PNG, JPEG, ...) or a .npy array") from None
