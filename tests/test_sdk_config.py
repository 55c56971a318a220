"""Config models: YAML round trip, unknown keys, strict types, ranges, overrides and name resolution."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import worldstep
import yaml
from tiny_world import cache_dir  # noqa: F401 - fixture
from worldstep import (
    CacheConfig,
    ConfigError,
    DecoderOptions,
    EnvConfig,
    ModelConfig,
    RolloutKnobs,
    WorldstepConfig,
    load_config,
)
from worldstep.world import resolve_config

SECTIONS = ("model", "rollout", "cache", "decoder", "env")


def test_public_api():
    assert {"load", "make_env", "evaluate", "World", "WorldstepConfig", "ModelConfig", "RolloutKnobs", "CacheConfig",
            "DecoderOptions", "EnvConfig"} <= set(worldstep.__all__)
    for name in worldstep.__all__:
        assert hasattr(worldstep, name)


@pytest.mark.parametrize("name", ["tiny", "cosmos3_edge", "cosmos3-edge", "cosmos3_nano", "cosmos3-nano"])
def test_shipped_configs_load_and_round_trip(name, tmp_path):
    config = load_config(name)
    path = tmp_path / "c.yaml"
    config.to_yaml(path)
    assert WorldstepConfig.from_yaml(path) == config
    written = yaml.safe_load(path.read_text())["model"]["architecture"]
    assert written == (None if config.model.architecture is None else config.model.architecture.model_dump())


def test_tiny_values():
    config = load_config("tiny")
    assert config.model.embedded_name == "tiny"
    assert config.rollout.chunk_size == 4 and config.env.domain_id == 8


def write(tmp_path, data) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def base() -> dict:
    return {"model": {"name": "x", "checkpoint": "/ckpt"}}


@pytest.mark.parametrize(
    ("section", "key", "value", "expect"),
    [
        ("rollout", "chunk_size", 6, "rollout.chunk_size = 6: must be a multiple of 4"),
        ("rollout", "chunk_size", 0, "rollout.chunk_size = 0"),
        ("rollout", "num_steps", 0, "rollout.num_steps = 0: must be >= 1"),
        ("rollout", "guidance_scale", 0.5, "rollout.guidance_scale = 0.5: must be >= 1"),
        ("rollout", "context_frames", -1, "rollout.context_frames = -1: must be >= 0"),
        ("rollout", "window_mode", "sliding", "rollout.window_mode = 'sliding': must be one of 'kv' or 'chained'"),
        ("rollout", "flow_shift", 0, "rollout.flow_shift = 0: must be > 0"),
        ("cache", "page_size", 0, "cache.page_size = 0: must be >= 1"),
        ("cache", "num_pages", 0, "cache.num_pages = 0"),
        ("cache", "cpu_offload_pages", -2, "cache.cpu_offload_pages = -2"),
        ("env", "max_windows", 0, "env.max_windows = 0: must be >= 1"),
        ("env", "prompt", "  ", "env.prompt = '  ': must be a non-empty string"),
        ("model", "device", "gpu", "model.device = 'gpu': must be one of 'auto', 'cpu', 'cpu:N', 'cuda', 'cuda:N'"),
        ("model", "attention_backend", "xformers", "model.attention_backend = 'xformers'"),
        ("model", "dtype", "float64", "model.dtype = 'float64'"),
    ],
)
def test_bad_ranges_name_key_value_and_range(tmp_path, section, key, value, expect):
    data = base()
    data.setdefault(section, {})[key] = value
    with pytest.raises(ConfigError, match="^" + expect.replace("(", r"\(").replace(".", r"\.")):
        WorldstepConfig.from_yaml(write(tmp_path, data))


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [("decoder", "warm_cache", "true"), ("decoder", "channels_last", "no"), ("decoder", "warm_cache", 1)],
)
def test_yaml_strings_for_booleans_are_errors(tmp_path, section, key, value):
    data = base()
    data[section] = {key: value}
    with pytest.raises(ConfigError, match=f"{section}.{key} = .*: must be a boolean"):
        WorldstepConfig.from_yaml(write(tmp_path, data))


@pytest.mark.parametrize("value", [True, 2.0, "4"])
def test_strict_ints(tmp_path, value):
    data = base()
    data["rollout"] = {"num_steps": value}
    with pytest.raises(ConfigError, match="rollout.num_steps = .*: must be an integer"):
        WorldstepConfig.from_yaml(write(tmp_path, data))


def test_float_knobs_accept_ints():
    assert RolloutKnobs(guidance_scale=2, flow_shift=3).guidance_scale == 2.0


@pytest.mark.parametrize("where", ["top", "rollout", "model"])
def test_unknown_keys_are_named(tmp_path, where):
    data = base()
    if where == "top":
        data["rollot"] = {}
    else:
        data.setdefault(where, {})["bogus"] = 1
    key = "rollot" if where == "top" else f"{where}.bogus"
    with pytest.raises(ConfigError, match=f"^{key}: unknown key"):
        WorldstepConfig.from_yaml(write(tmp_path, data))


def test_several_errors_reported_together(tmp_path):
    data = base()
    data["rollout"] = {"num_steps": 0, "chunk_size": 5}
    with pytest.raises(ConfigError) as err:
        WorldstepConfig.from_yaml(write(tmp_path, data))
    assert "rollout.num_steps" in str(err.value) and "rollout.chunk_size" in str(err.value)


def test_embedded_checkpoint_needs_architecture():
    with pytest.raises(ConfigError, match="model.architecture: required"):
        WorldstepConfig(model={"name": "x", "checkpoint": "embedded:x"})


def test_missing_model_section():
    with pytest.raises(ConfigError, match="^model: required key is missing"):
        WorldstepConfig.from_dict({"rollout": {}})


def test_configs_are_frozen():
    config = load_config("tiny")
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises ValidationError for frozen instances
        config.rollout.num_steps = 3


def test_each_section_validates_alone():
    for cls, kwargs in [(RolloutKnobs, {"chunk_size": 3}), (CacheConfig, {"page_size": 0}),
                        (DecoderOptions, {"latents_per_call": -1}), (EnvConfig, {"domain_id": True}),
                        (ModelConfig, {"name": "", "checkpoint": "x"})]:
        with pytest.raises(ConfigError):
            cls(**kwargs)


def test_config_sections_are_the_engine_models():
    """One definition per knob set: the YAML sections are the engine's own models, validated the same way."""
    config = load_config("tiny")
    assert type(config.rollout) is RolloutKnobs and type(config.decoder) is DecoderOptions
    assert config.rollout.latents_per_window == config.rollout.chunk_size // 4
    with pytest.raises(ConfigError, match="chunk_size = 6: must be a multiple of 4"):
        RolloutKnobs(chunk_size=6)
    with pytest.raises(ConfigError, match="rollout.chunk_size = 6: must be a multiple of 4"):
        config.with_overrides(chunk_size=6)


def test_overrides_by_field_and_section():
    config = load_config("tiny").with_overrides(num_steps=2, cache={"num_pages": 64}, max_windows=3)
    assert config.rollout.num_steps == 2 and config.cache.num_pages == 64 and config.env.max_windows == 3
    with pytest.raises(ConfigError, match="^num_stepz: unknown key"):
        load_config("tiny").with_overrides(num_stepz=2)
    with pytest.raises(ConfigError, match="rollout.num_steps = 0"):
        load_config("tiny").with_overrides(num_steps=0)


def test_resolve_names_paths_and_checkpoints(tmp_path):
    assert resolve_config("tiny") == load_config("tiny")
    path = tmp_path / "mine.yaml"
    load_config("tiny").with_overrides(num_steps=3).to_yaml(path)
    assert resolve_config(path).rollout.num_steps == 3
    ckpt = tmp_path / "my-ckpt"
    ckpt.mkdir()
    config = resolve_config(ckpt)
    assert config.model.checkpoint == str(ckpt) and config.model.name == "my-ckpt"
    assert resolve_config("nvidia/Cosmos3-Edge").model.checkpoint == "nvidia/Cosmos3-Edge"
    with pytest.raises(ConfigError, match="model = 'nope'"):
        resolve_config("nope")
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        load_config(tmp_path / "missing.yaml")


def test_dotted_keys_are_python_keywords_too(cache_dir):  # noqa: F811
    config = load_config("tiny").with_overrides(**{"decoder.dtype": "bfloat16", "rollout.num_steps": 2})
    assert (config.decoder.dtype, config.model.dtype, config.rollout.num_steps) == ("bfloat16", None, 2)
    world = worldstep.load("tiny", device="cpu", **{"rollout.num_steps": 2, "height": 32, "width": 32})
    env = worldstep.make_env(world, **{"env.max_windows": 3})
    assert world.config.rollout.num_steps == 2 and env.get_wrapper_attr("max_windows") == 3
    env.close()
    with pytest.raises(worldstep.ConfigError, match=r"decoder\.dtyp: unknown key .*did you mean 'dtype'"):
        load_config("tiny").with_overrides(**{"decoder.dtyp": "bfloat16"})
    with pytest.raises(worldstep.ConfigError, match=r"decodr\.dtype: unknown key"):
        load_config("tiny").with_overrides(**{"decodr.dtype": "bfloat16"})


def test_the_unknown_key_error_lists_each_key_once_with_its_section():
    with pytest.raises(worldstep.ConfigError) as err:
        load_config("tiny").with_overrides(dtyp="bfloat16")
    message = str(err.value)
    assert "did you mean 'model.dtype' or 'decoder.dtype'?" in message
    listed = message.rpartition(": ")[2].split(", ")
    every = [f"{s}.{k}" for s in SECTIONS for k in type(getattr(load_config("tiny"), s)).model_fields]
    assert listed == every and len(set(listed)) == len(listed)


def test_every_config_field_is_in_the_configuration_reference():
    """docs/configuration.md promises every key: each field of each section has a row (shown failing by deleting
    the `decode` row: the test names rollout.decode)."""
    rows = {}
    section = None
    for line in (Path(__file__).parents[1] / "docs" / "configuration.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 4 and "`" in cells[1]:
            section = cells[0] or section
            rows.setdefault(section, set()).update(re.findall(r"`(\w+)`", cells[1]))
    missing = [f"{s}.{k}" for s in SECTIONS for k in type(getattr(load_config("tiny"), s)).model_fields
               if k not in rows.get(s, set())]
    assert not missing, f"docs/configuration.md has no row for {missing}"


def test_the_written_constructor_keys_are_the_installed_diffusers_classes():
    """A config's architecture block is checked against diffusers' constructors without importing diffusers (a
    written copy of their arguments); the copy must be what the installed classes take."""
    from worldstep.engine.models.cosmos3.architecture import CONSTRUCTOR_KEYS, constructor_keys

    for kind in ("transformer", "vae"):
        assert CONSTRUCTOR_KEYS[kind] == constructor_keys(kind), kind


def test_a_config_error_in_the_cli_comes_without_importing_torch():
    """`worldstep rollout --set rollout.num_steps=0` refuses the value before anything imports torch (it took
    about 5 s before, the architecture check importing diffusers): `-X importtime` lists every import."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "worldstep.cli", "rollout", "--set",
                          "rollout.num_steps=0"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "rollout.num_steps = 0: must be >= 1" in run.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time")}
    assert "worldstep.config" in imported and not {"torch", "diffusers"} & imported


def test_a_keyword_given_as_none_keeps_the_configs_value_and_is_still_checked():
    """`worldstep.load(..., key=None)` means the config's default (scripts pass optional flags straight through);
    an unknown key is a TypeError whatever its value; a section mapping still sets None explicitly."""
    from worldstep.world import given

    assert given({"num_steps": None, "decoder.dtype": None, "max_windows": 3}) == {"max_windows": 3}
    assert given({"env": {"domain_id": None}}) == {"env": {"domain_id": None}}
    for bad in ({"num_stepz": None}, {"rollout.num_stepz": None}, {"rolout.num_steps": 2}):
        with pytest.raises(TypeError, match="unknown key"):
            given(bad)
    world = worldstep.load("tiny", num_steps=None, **{"decoder.dtype": None}, share=True)
    assert world.config == worldstep.load("tiny", share=True).config
