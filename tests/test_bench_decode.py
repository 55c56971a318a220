"""`worldstep bench decode` at toy sizes: the three alternatives, the work ratios by construction, the warm
exactness check, and bad sizes refused before any work."""

from __future__ import annotations

import json

import pytest
from worldstep.bench import main
from worldstep.engine.vae import WHOLE_CLIP_DECODE_ATOL

TOY = ["--height", "32", "--width", "32", "--base-dim", "4", "--window-latents", "1,3", "--timed-windows", "3",
       "--context-latents", "2", "--threads", "1", "--quiet"]


def test_decode_bench_rows(tmp_path, capsys):
    path = tmp_path / "decode.json"
    assert main(["decode", *TOY, "--json", str(path)]) == 0
    assert "whole clip / warm" in capsys.readouterr().out
    doc = json.loads(path.read_text())
    f = doc["results"]
    assert f["warm_within_bound"] is True and f["warm_max_abs_diff"] <= WHOLE_CLIP_DECODE_ATOL == f["bound"]
    assert [r["latents_per_window"] for r in f["rows"]] == [1, 3]
    for r in f["rows"]:
        w = r["latents_per_window"]
        assert r["frames_per_window"] == 4 * w
        # timed windows follow latent 0 and the 2-latent prefix; the clip grows by a window each time
        assert r["clip_latents"] == [3 + w, 3 + 2 * w, 3 + 3 * w]
        assert r["work_stateless_over_warm"] == pytest.approx((2 + w) / w)
        assert r["work_whole_clip_over_warm"] == pytest.approx(sum(r["clip_latents"]) / 3 / w)
        assert set(r["ms"]) == set(r["cpu_ms"]) == {"warm", "stateless", "whole_clip"}
        assert all(len(v) == 3 and min(v) > 0 for v in r["samples_ms"].values())
        assert r["stateless_over_warm"] == pytest.approx(r["ms"]["stateless"] / r["ms"]["warm"])
        assert r["whole_clip_over_warm"] == pytest.approx(r["ms"]["whole_clip"] / r["ms"]["warm"])
        # past the context the stateless path is an approximation; warm is exact within the bound
        assert 0 < r["stateless_psnr_db"] < 100
        assert r["warm_max_abs_diff"] <= WHOLE_CLIP_DECODE_ATOL and r["warm_cache_bytes"] > 0


@pytest.mark.parametrize("flags, message", [(["--height", "40"], "multiples of 16"),
                                            (["--timed-windows", "2"], "timed_windows=2"),
                                            (["--window-latents", "0,1"], "window_latents")])
def test_decode_bench_refuses_bad_sizes(flags, message, capsys):
    assert main(["decode", "--quiet", *flags]) == 2
    assert message in capsys.readouterr().err
