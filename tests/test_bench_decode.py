"""`run_decode_bench` at toy sizes: structure, warm exactness, cache scaling."""

from __future__ import annotations

import json

import pytest
import torch
from worldstep.bench.decode_lockstep import format_table, run_decode_bench
from worldstep.engine.vae import WHOLE_STREAM_DECODE_ATOL


def test_decode_bench_smoke(capsys):
    threads = torch.get_num_threads()
    result = run_decode_bench(
        height=32, width=32, window_latents=(1, 2), timed_windows=1, context_latents=2,
        cache_sizes=((32, 32), (64, 32)), base_dim=8, z_dim=4, dim_mult=(1, 1, 1, 1), threads=1, progress=False,
    )
    assert result["config"]["threads"] == 1 and torch.get_num_threads() == threads
    json.dumps(result, allow_nan=False)  # the CLI's --json
    assert "latents/window" in capsys.readouterr().out

    assert result["warm_within_bound"] is True and result["warm_max_abs_diff"] <= WHOLE_STREAM_DECODE_ATOL
    assert [r["latents_per_window"] for r in result["windows"]] == [1, 2]
    for r in result["windows"]:
        assert r["frames_per_window"] == 4 * r["latents_per_window"]
        assert r["warm_ms"] > 0 and r["stateless_ms"] > 0
        assert r["speedup"] == pytest.approx(r["stateless_ms"] / r["warm_ms"], rel=1e-2)
        assert r["warm_cpu_ms"] > 0 and r["cpu_speedup"] == pytest.approx(r["stateless_cpu_ms"] / r["warm_cpu_ms"], rel=1e-2)
        # timed windows start past the context, so the stateless path is only approximate
        assert r["stateless_psnr_db"] is not None and 0 < r["stateless_psnr_db"] < 100
    sizes = [(c["height"], c["width"]) for c in result["cache"]]
    assert sizes == [(32, 32), (64, 32)]
    assert result["cache"][1]["warm_cache_bytes"] == 2 * result["cache"][0]["warm_cache_bytes"] > 0
    assert result["cache_scaling"] == 1.0
    assert result["stream_cache_bytes"] == result["cache"][0]["warm_cache_bytes"]
    assert result["config"]["stream_latents"] == 1 + 2 + 1 + 2
    assert "within the 1e-05 bound" in format_table(result)


@pytest.mark.parametrize("bad", [{"height": 40}, {"cache_sizes": ((32, 32), (48, 8))}, {"timed_windows": 0}])
def test_decode_bench_refuses_bad_sizes(bad):
    with pytest.raises(ValueError):
        run_decode_bench(**bad, verbose=False, progress=False)
