"""The released Cosmos3-Nano's config: its numbers, its family switches, and its memory plan."""

from __future__ import annotations

import inspect
import json

from diffusers import Cosmos3OmniTransformer
from worldstep import ConfigError, load_config
from worldstep.cli import main
from worldstep.engine.models.cosmos3 import FAMILY_SWITCHES


def test_nano_numbers_are_the_released_model():
    t = load_config("cosmos3_nano").model.architecture.transformer
    assert (t["hidden_size"], t["num_hidden_layers"], t["num_attention_heads"], t["num_key_value_heads"]) == (
        4096, 36, 32, 8)
    assert (t["head_dim"], t["intermediate_size"], t["vocab_size"], t["rope_theta"]) == (128, 12288, 151936, 5e6)
    assert t["rope_axes_dim"] == [24, 20, 20] and t["action_dim"] == 64 and t["num_embodiment_domains"] == 32
    # diffusers' Cosmos3OmniTransformer defaults are Nano's: every default the block sets agrees
    defaults = {k: p.default for k, p in inspect.signature(Cosmos3OmniTransformer.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty and p.default is not None}
    shared = {k for k in t if k in defaults and k not in ("action_gen",)}
    assert len(shared) >= 14
    assert {k: t[k] for k in shared} == {k: defaults[k] for k in shared}


def test_family_switches_match_the_shipped_configs():
    for name, family in (("cosmos3_nano", "nano"), ("cosmos3_edge", "edge"), ("tiny", "edge")):
        arch = load_config(name).model.architecture
        assert arch.shaped_like(family) == arch, name
    nano = load_config("cosmos3_nano").model.architecture
    edge = load_config("cosmos3_edge").model.architecture
    assert nano.vae == edge.vae  # one Wan 2.2 VAE
    assert FAMILY_SWITCHES["nano"]["hidden_act"] == "silu" and FAMILY_SWITCHES["edge"]["hidden_act"] == "relu2"


def test_info_plans_nano_memory(tmp_path, capsys):
    assert main(["info", "--config", "cosmos3_nano", "--set", f"checkpoint={tmp_path / 'none'}",
                 "--set", "dtype=bfloat16", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    memory = info["memory"]
    assert not info["loaded"] and info["model"] == "cosmos3-nano"
    assert memory["kv_bytes_per_token"] == 36 * 2 * 8 * 128 * 2  # layers x K,V x kv heads x head_dim x bf16
    assert memory["tokens_per_frame"] == (480 // 16 // 2) * (832 // 16 // 2)  # 15 x 26 patches
    assert memory["page_bytes"] == 128 * 147456 and memory["peak_pages_per_episode"] > 0


def test_builder_refuses_bad_family_and_pipeline_options():
    import pytest
    from worldstep.engine.models.cosmos3.checkpoint import build_pipeline

    tiny = load_config("tiny").model.architecture
    with pytest.raises(ValueError, match="family='mini' is invalid; allowed: \\['edge', 'nano'\\]"):
        tiny.shaped_like("mini")
    block = tiny.model_dump()
    with pytest.raises(ConfigError, match="pipeline.system: unknown key"):
        build_pipeline({**block, "pipeline": {"system": True}})
    with pytest.raises(ConfigError, match="pipeline.default_use_system_prompt = 'yes': must be a boolean"):
        build_pipeline({**block, "pipeline": {"default_use_system_prompt": "yes"}})
    with pytest.raises(ConfigError, match=r"transformer = .*unknown: \['hiden_size'\]"):
        build_pipeline({**block, "transformer": {**block["transformer"], "hiden_size": 8}})
