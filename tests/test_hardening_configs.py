"""Property tests for config files: random unknown keys, wrong types and YAML-string booleans are
rejected with a ConfigError (a ValueError) that names the offending key."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from worldstep import ConfigError, WorldstepConfig

SETTINGS = settings(max_examples=60, deadline=None)
INT_KNOBS = [("rollout", "chunk_size"), ("rollout", "num_steps"), ("rollout", "context_frames"),
             ("cache", "page_size"), ("cache", "num_pages"), ("cache", "cpu_offload_pages"),
             ("decoder", "latents_per_call"), ("decoder", "max_warm_sessions"), ("env", "max_windows")]
BOOL_KNOBS = [("decoder", "warm_cache"), ("decoder", "channels_last"), ("decoder", "cudnn_benchmark"),
              ("decoder", "onednn_conv")]


def _load(tmp_path, data) -> WorldstepConfig:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return WorldstepConfig.from_yaml(path)


def _base() -> dict:
    return {"model": {"name": "x", "checkpoint": "/ckpt"}}


def _assert_rejected(tmp_path, knob, value) -> None:
    """A config with `value` at `knob` is a ConfigError naming `section.key`."""
    section, key = knob
    data = _base()
    data[section] = {key: value}
    with pytest.raises(ConfigError, match=f"{section}\\.{key}"):
        _load(tmp_path, data)


@SETTINGS
@given(knob=st.sampled_from(INT_KNOBS),
       value=st.one_of(st.booleans(), st.floats(allow_nan=True), st.text(max_size=4),
                       st.lists(st.integers(), max_size=2), st.integers(max_value=-1)))
def test_int_knobs_reject_wrong_types_and_negatives(tmp_path, knob, value):
    _assert_rejected(tmp_path, knob, value)


@SETTINGS
@given(knob=st.sampled_from(BOOL_KNOBS),
       value=st.one_of(st.sampled_from(["true", "false", "yes", "no", "on", "off", "0", "1"]), st.integers(),
                       st.floats(allow_nan=False)))
def test_switches_must_be_real_booleans(tmp_path, knob, value):
    _assert_rejected(tmp_path, knob, value)


@SETTINGS
@given(section=st.sampled_from(["model", "rollout", "cache", "decoder", "env", None]),
       key=st.from_regex(r"[a-z][a-z_]{2,12}", fullmatch=True))
def test_unknown_keys_are_named(tmp_path, section, key):
    data = _base()
    fields = (WorldstepConfig.model_fields if section is None
              else WorldstepConfig.model_fields[section].annotation.model_fields)
    if key in fields:
        return  # a real knob, not an unknown key
    (data if section is None else data.setdefault(section, {}))[key] = 1
    with pytest.raises(ConfigError, match=key):
        _load(tmp_path, data)
