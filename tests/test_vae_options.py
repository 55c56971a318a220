"""`DecoderOptions` validation: strict switches, bounded counts, window check, messages."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError
from worldstep.engine.vae import DecoderOptions


def test_defaults():
    o = DecoderOptions()
    assert (o.warm_cache, o.latents_per_call, o.channels_last, o.cudnn_benchmark, o.onednn_conv) == (
        True, 1, "auto", "auto", False)
    assert (o.dtype, o.fused) == ("auto", "auto")
    assert (o.max_warm_sessions, o.context_latents) == (0, 8)


def test_yaml_values_load():
    o = DecoderOptions(**yaml.safe_load("warm_cache: false\nlatents_per_call: 0\nmax_warm_sessions: 4\n"))
    assert o.warm_cache is False and o.latents_per_call == 0 and o.max_warm_sessions == 4


@pytest.mark.parametrize("key", ["warm_cache", "channels_last", "cudnn_benchmark", "onednn_conv", "fused"])
@pytest.mark.parametrize("value", ["false", "true", "no", 0, 1, None])
def test_switches_must_be_real_booleans(key, value):
    with pytest.raises(ValueError) as err:
        DecoderOptions(**{key: value})
    msg = str(err.value)
    assert key in msg and repr(value) in msg and "boolean" in msg


def test_yaml_string_false_is_an_error_not_true():
    with pytest.raises(ValueError, match="warm_cache"):
        DecoderOptions(**yaml.safe_load('warm_cache: "false"'))


@pytest.mark.parametrize(
    ("key", "value", "lowest"),
    [
        ("latents_per_call", -1, 0),
        ("max_warm_sessions", -2, 0),
        ("context_latents", 0, 1),
        ("context_latents", -8, 1),
        ("latents_per_call", 1.5, 0),
        ("max_warm_sessions", "3", 0),
        ("context_latents", True, 1),
        ("latents_per_call", None, 0),
    ],
)
def test_counts_are_integers_in_range(key, value, lowest):
    with pytest.raises(ValueError) as err:
        DecoderOptions(**{key: value})
    msg = str(err.value)
    assert key in msg and repr(value) in msg and f">= {lowest}" in msg


def test_unknown_keys_are_refused_and_options_are_frozen():
    with pytest.raises(ValueError, match="warm_cach: unknown key"):
        DecoderOptions(warm_cach=True)
    o = DecoderOptions()
    with pytest.raises(ValidationError):
        o.warm_cache = False


def test_latents_per_call_is_checked_against_the_window():
    DecoderOptions(latents_per_call=8).validate_for_window(8)
    DecoderOptions(latents_per_call=0).validate_for_window(1)
    with pytest.raises(ValueError) as err:
        DecoderOptions(latents_per_call=9).validate_for_window(8)
    msg = str(err.value)
    assert "latents_per_call" in msg and "9" in msg and "0..8" in msg
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="latents_per_window"):
            DecoderOptions().validate_for_window(bad)
