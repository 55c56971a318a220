"""`decoder.dtype`, `channels_last`, `cudnn_benchmark` and `fused` default to "auto", decided by the VAE's device;
bf16 against float32 over a stream stays within the bound measured by tools/decode_dtype_bound.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from vae_models import FAMILIES, decode_windows, random_latents
from worldstep.engine.vae import BF16_DECODE_ATOL, BF16_DECODE_PSNR_DB, DecoderOptions
from worldstep.engine.vae.decoder import WarmWanDecoder
from worldstep.engine.vae.options import resolve_dtype, resolve_switch

ROOT = Path(__file__).parent.parent
CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


def test_auto_is_bf16_and_every_switch_on_for_cuda_and_float32_and_off_on_a_cpu():
    assert resolve_dtype("auto", CUDA, torch.float32) == torch.bfloat16
    assert resolve_dtype("auto", CPU, torch.float32) == torch.float32
    assert resolve_dtype("auto", CPU, torch.bfloat16) == torch.float32
    assert resolve_dtype(None, CUDA, torch.float16) == torch.float16  # null: the VAE's own
    assert resolve_dtype("float16", CPU, torch.float32) == torch.float16
    assert resolve_switch("auto", CUDA) and not resolve_switch("auto", CPU)
    assert resolve_switch(True, CPU) and not resolve_switch(False, CUDA)


def test_a_cpu_decoder_resolves_auto_to_the_vaes_float32_path_with_no_private_copy():
    build, grid = FAMILIES["wan22"]
    vae = build(seed=1)
    dec = WarmWanDecoder(vae)  # every option at its default, "auto"
    assert (dec.dtype, dec.prelude_dtype) == (torch.float32, torch.float32)
    assert not (dec.channels_last or dec.cudnn_benchmark or dec.fused)
    assert dec._decoder is vae.decoder  # nothing to copy: the shared decoder itself


def test_a_bf16_decoder_keeps_the_prelude_in_float32_and_its_cache_in_bf16():
    build, grid = FAMILIES["wan21"]
    dec = WarmWanDecoder(build(seed=1), DecoderOptions(dtype="bfloat16"))
    assert (dec.dtype, dec.prelude_dtype) == (torch.bfloat16, torch.float32)
    session = dec.open_session()
    pixels = decode_windows(dec, session, random_latents(3, grid, seed=2), [1, 2])
    assert all(p.dtype == torch.float32 for p in pixels)
    slots = [s for s in session.slots if isinstance(s, torch.Tensor)]
    assert slots and all(s.dtype == torch.bfloat16 for s in slots) and session.context.dtype == torch.float32


@pytest.mark.parametrize(("key", "value"), [("dtype", "bf16"), ("dtype", True), ("channels_last", "on"),
                                            ("cudnn_benchmark", 1), ("fused", None)])
def test_auto_knobs_refuse_other_values_naming_the_key(key, value):
    with pytest.raises(ValueError) as err:
        DecoderOptions(**{key: value})
    assert key in str(err.value) and repr(value) in str(err.value) and "auto" in str(err.value)


def _tool():
    """`tools/decode_dtype_bound.py`, the measuring script of docs/exactness.md (not shipped in the package)."""
    spec = importlib.util.spec_from_file_location("decode_dtype_bound", ROOT / "tools" / "decode_dtype_bound.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _assert_within_bound(rows: list[dict]) -> None:
    assert rows and all(r["psnr_db"] >= BF16_DECODE_PSNR_DB and r["max_abs"] <= BF16_DECODE_ATOL for r in rows), rows
    assert all(r["max_abs"] > 0 for r in rows)  # bf16 really ran: a float32 decode on both sides would be 0


@pytest.mark.parametrize("fused", [False, True], ids=["diffusers-ops", "fused"])
def test_bf16_against_float32_on_the_trained_pusher_vae_stays_within_the_bound(fused):
    tool = _tool()
    vae = tool.pusher_vae()
    z = tool.pusher_latents(vae, 6)
    _assert_within_bound(tool.compare_dtypes(vae, z, 1, fused=fused))


@pytest.mark.slow
def test_bf16_against_float32_on_a_vae_of_edges_proportions_stays_within_the_bound():
    tool = _tool()
    vae = tool.edge_vae()
    z = torch.randn(1, vae.config.z_dim, 8, 1, 1, generator=torch.Generator().manual_seed(0))
    _assert_within_bound(tool.compare_dtypes(vae, z, 4))
