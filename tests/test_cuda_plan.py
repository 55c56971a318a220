"""``worldstep info --device cuda`` plans a CUDA run on a machine without one, in the dtypes the loader uses, and
its plan is checked against the peaks measured on an H200 (docs/bench/gpu/h200-141gb)."""

from __future__ import annotations

import json

import pytest
import torch
import worldstep
from worldstep.cli import main
from worldstep.cuda_plan import H200_JSON, cuda_plan, decoder_dtype, measured_peaks, transformer_dtype

LOW, HIGH = 0.95, 1.35
"""The stated factor: the plan is within 0.95-1.35x of every measured peak (it measured 0.98-1.30x)."""


def test_info_plans_cuda_without_a_gpu_in_the_loaders_dtypes(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU box, also on a GPU runner
    assert main(["info", "--config", "cosmos3_edge", "--device", "cuda", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    planned = out["cuda_plan"]
    params = json.loads(H200_JSON.read_text())["results"]
    assert planned["dtype"] == "bfloat16" and planned["decoder_dtype"] == "bfloat16"
    mib = 2**20  # parameters as counted on the GPU; the plan adds the modules' few buffers
    assert 0 <= planned["transformer_bytes"] - 2 * params["transformer_params"] < mib  # bf16, as the loader on CUDA
    assert 0 <= planned["vae_bytes"] - 4 * params["vae_params"] < mib
    assert 0 < planned["decoder_copy_bytes"] < planned["vae_bytes"]
    assert out["memory"]["kv_bytes_per_token"] == 28 * 2 * 8 * 128 * 2
    assert [p["sessions"] for p in out["measured"]["peaks"]] == [1, 4, 8, 1] and out["measured"]["device"]
    assert main(["info", "--config", "cosmos3_edge", "--device", "cuda", "--dtype", "float32", "--json"]) == 0
    fp32 = json.loads(capsys.readouterr().out)["cuda_plan"]["transformer_bytes"]
    assert 0 <= fp32 - 4 * params["transformer_params"] < mib
    assert main(["info", "--config", "cosmos3_edge", "--device", "cuda"]) == 0
    text = capsys.readouterr().out
    assert "transformer (bfloat16)" in text and "measured on NVIDIA H200" in text


def test_the_decoder_dtype_follows_the_config_through_one_helper():
    config = worldstep.load_config("cosmos3_edge")
    assert (decoder_dtype(config, "cuda"), decoder_dtype(config, "cpu")) == ("bfloat16", "float32")
    forced = config.with_overrides(**{"decoder.dtype": "float32"})
    assert decoder_dtype(forced, "cuda") == "float32"
    assert transformer_dtype(config, "cuda:0") == "bfloat16" and transformer_dtype(config, "cpu") == "float32"


@pytest.mark.parametrize("cfg", [False, True])
def test_the_plan_is_within_the_stated_factor_of_the_h200s_measured_peaks(cfg):
    """Planned with the settings of the measured run (its decoder dtype, pool, context and CFG): each peak within
    LOW..HIGH. Shown failing by planning the weights in float32 (the old plan): 1.5x at one session."""
    device, settings, peaks = measured_peaks()
    config = worldstep.load_config("cosmos3_edge").with_overrides(
        **{"model.dtype": settings["dtype"], "decoder.dtype": settings["decoder_dtype"],
           "num_pages": settings["pool_pages"], "context_frames": settings["context_frames"],
           "guidance_scale": 3.0 if cfg else 1.0})
    planned, memory = cuda_plan(config, windows=64, text_tokens=512)
    assert memory.page_bytes == settings["page_bytes"] and device == "NVIDIA H200"
    chosen = [p for p in peaks if p.cfg == cfg]
    assert chosen
    for peak in chosen:
        ratio = planned.peak_bytes(peak.sessions) / peak.peak_bytes
        assert LOW <= ratio <= HIGH, (peak, ratio)


def test_usage_md_edge_figures_are_generated_from_the_committed_gpu_json():
    import importlib.util

    root = H200_JSON.parents[4]
    spec = importlib.util.spec_from_file_location("edge_figures", root / "tools" / "edge_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    block = (root / "docs" / "usage.md").read_text().split(module.BEGIN, 1)[1].split(module.END, 1)[0].strip()
    assert block == module.render(), "stale: python tools/edge_figures.py docs/usage.md"
    assert "30 steps 1,750 ms" in block and "8 sessions 43.7 GiB" in block and "NVIDIA H200" in block
