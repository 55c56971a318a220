"""`worldstep bench`: every CPU subcommand end to end at toy sizes, its JSON, and the FLOP count.

No timing assertions: figures are only checked for structure and sanity (positive, finite ratios;
flat pages; pipelined frames equal to sequential ones).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from worldstep.bench import main
from worldstep.bench.measure import interleave
from worldstep.bench.report import headline_table, load_docs, render_markdown
from worldstep.bench.soak import pages_flat

FAST = ["--threads", "1", "--quiet"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("bench-cache"))


def _run(tmp_path, name: str, *flags: str) -> dict:
    path = tmp_path / f"{name}.json"
    assert main([name, "--json", str(path), *FAST, *flags]) == 0
    doc = json.loads(path.read_text())  # strict JSON: NaN is written as null
    assert doc["bench"] == name and doc["schema"] == 1
    assert doc["machine"]["nproc"] >= 1 and doc["machine"]["torch_threads"] == 1
    for table in doc["tables"]:
        assert all(len(row) == len(table["columns"]) for row in table["rows"])
    return doc


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_rollout(tmp_path, cache, capsys):
    doc = _run(tmp_path, "rollout", "--archs", "tiny", "--rounds", "1", "--warmup", "1", "--num-steps", "1",
               "--scan-windows", "6", "--scan-span", "2", "--pipeline-windows", "2", "--pipeline-rounds", "1",
               "--cache-dir", cache)
    assert "(c) official recipe" in capsys.readouterr().out
    steps = doc["results"]["steps"]["tiny"]
    assert set(steps["ms_per_step"]) == {"kv", "kv_exact", "chained", "official"}
    assert _positive(steps["ratio_official_over_kv_exact"])
    assert all(_positive(v) for v in steps["ms_per_step"].values())
    assert _positive(steps["ratio_official_over_kv"]) and _positive(steps["ratio_chained_over_kv"])
    assert steps["phases"]["official"]["encode_ms"] > 0  # the recipe re-encodes the last frame
    scan = doc["results"]["scan"]
    assert [w["window"] for w in scan["per_window"]] == list(range(1, 7))
    assert _positive(scan["late_over_early"]) and _positive(scan["late_over_early_interleaved"])
    assert scan["pages_last"] <= scan["pages_max_after_span"]
    pipe = doc["results"]["pipelined"]
    assert pipe["frames_equal"] is True and _positive(pipe["speedup"])


def test_vector(tmp_path, cache):
    doc = _run(tmp_path, "vector", "--sizes", "1,2", "--rounds", "1", "--warmup", "0", "--num-steps", "1",
               "--cache-dir", cache)
    rows = doc["results"]["by_n"]
    assert [r["n"] for r in rows] == [1, 2]
    for r in rows:
        assert _positive(r["speedup"]) and _positive(r["steps_per_s"]["separate"])
        assert set(r["phases_ms"]["batched"]) == {"denoise_ms", "commit_ms", "decode_ms"}
        if "vector_env" in r["steps_per_s"]:
            assert _positive(r["speedup_vector_env"])


def test_vector_on_the_shipped_pusher_weights(tmp_path):
    doc = _run(tmp_path, "vector", "--arch", "pusher", "--sizes", "2", "--rounds", "1", "--warmup", "0",
               "--num-steps", "1", "--no-vector-env")
    assert doc["results"]["arch"] == "pusher" and (doc["results"]["height"], doc["results"]["width"]) == (64, 64)
    assert _positive(doc["results"]["by_n"][0]["speedup"])


def test_official_recipe_comparison_refuses_a_model_without_the_droid_domain(tmp_path, capsys):
    from worldstep.cli import main

    assert main(["bench", "rollout", "--archs", "pusher", "--scan-windows", "0", "--pipeline-windows", "0",
                 "--quiet"]) == 2
    assert "arch='pusher' is invalid for the official-recipe comparison" in capsys.readouterr().err


def test_soak_pages_flat(tmp_path, cache):
    doc = _run(tmp_path, "soak", "--windows", "40", "--rss-from", "10", "--num-steps", "1", "--cache-dir", cache)
    f = doc["results"]
    assert len(f["per_window"]) == 40
    assert f["pages_flat"] is True and f["pages_max_after_full"] - f["pages_min_after_full"] <= 1
    assert f["pool_pages_after_close"] == 0
    assert f["rss_mib_last"] > 0 and math.isfinite(f["rss_growth_pct"])


def test_decode(tmp_path):
    doc = _run(tmp_path, "decode", "--quick")
    if doc["results"]:  # skipped (with a note) when the decoder bench is absent
        assert doc["results"]["warm_within_bound"] is True
        assert all(_positive(r["speedup"]) for r in doc["results"]["windows"])
    else:
        assert "skipped" in doc["notes"][0]


def test_gpu_without_cuda_exits_zero(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the real thing (tests/gpu/run_gpu_checks.sh)")
    doc = _run(tmp_path, "gpu")
    assert doc["results"]["skipped"] is True and "CUDA" in doc["notes"][0]


def test_gpu_code_path_on_cpu(tmp_path):
    doc = _run(tmp_path, "gpu", "--arch", "tiny", "--allow-cpu", "--steps", "1", "--guidance", "1,2",
               "--windows", "1", "--sections", "windows")
    runs = doc["results"]["runs"]
    assert [(r["num_steps"], r["cfg"]) for r in runs] == [(1, False), (1, True)]
    for r in runs:
        assert _positive(r["ms_per_denoise_step"]) and _positive(r["real_time_factor"])
        assert _positive(r["forward_tflop"]) and r["mfu"] is None  # no known peak for a CPU
        assert r["latents_finite"] is True
    assert runs[1]["forward_tflop"] > runs[0]["forward_tflop"]  # CFG adds the uncond row
    assert doc["results"]["vae_dtype"] == "float32"  # the VAE users get, not the transformer's dtype


def test_gpu_sessions_official_backends_on_cpu(tmp_path):
    partial = tmp_path / "partial.json"
    doc = _run(tmp_path, "gpu", "--arch", "tiny", "--allow-cpu", "--windows", "1", "--sessions", "1,2",
               "--session-steps", "1", "--official-steps", "1", "--sections", "sessions,official,backends",
               "--partial-json", str(partial))
    f = doc["results"]
    assert [s["sessions"] for s in f["sessions"]] == [1, 2]
    for s in f["sessions"]:
        assert 0 < s["peak_kv_pages"] <= s["plan_kv_pages"]  # sampled after each commit's release: <= the plan
        assert s["kv_pages_after_close"] == 0 and _positive(s["env_steps_per_s"])
    assert f["sessions"][1]["plan_kv_pages"] == 2 * f["sessions"][0]["plan_kv_pages"]
    # 128x128 is no pipeline canvas: the recipe would pad, so the comparison refuses instead of flattering
    assert f["official"]["skipped"] is True and "canvas" in f["official"]["reason"]
    assert set(f["backends"]["ms_per_denoise_step"]) == {"sdpa"} and "flashinfer" in f["backends"]["flashinfer_note"]
    assert json.loads(partial.read_text())["results"]["section_s"].keys() == {"sessions", "official", "backends"}


def test_gpu_bad_section_is_refused(tmp_path):
    assert main(["gpu", "--allow-cpu", "--arch", "tiny", "--sections", "windows,everything", *FAST]) == 2


def test_profile_and_report(tmp_path, cache):
    doc = _run(tmp_path, "profile", "--archs", "tiny", "--windows", "1", "--top", "3", "--cache-dir", cache)
    p = doc["results"]["profiles"]["tiny"]
    assert set(p["phases_ms"]) == {"denoise", "commit", "decode"} and len(p["top_ops"]) == 3
    docs = load_docs([tmp_path / "profile.json"])
    assert "Top operators" in render_markdown(docs)


def test_report_headline_from_documents():
    doc = {"bench": "soak", "machine": {"cpu": "x", "nproc": 2}, "tables": [], "notes": [], "results": {
        "windows": 40, "pages_min_after_full": 19, "pages_max_after_full": 20, "rss_from_window": 10, "rss_block_windows": 6,
        "rss_growth_pct": 0.5}}
    table = headline_table([doc])
    assert table.rows[0][1] == "19..20" and table.rows[1][1] == "0.50%"


def test_gen_flops_match_torch_flop_counter(cache):
    """The analytic count equals torch's FlopCounterMode on the engine's own generation forward."""
    from worldstep.bench.archs import PROMPT, action_chunks, bench_arch, first_frame, load_model
    from worldstep.bench.flops import GenShape, forward_flops
    from worldstep.engine.attention import PagedAttentionBatch
    from worldstep.engine.models.cosmos3 import RolloutKnobs
    from worldstep.engine.models.cosmos3.runner import gen_forward

    arch = bench_arch("tiny")
    model = load_model(arch, cache_dir=cache)
    knobs = RolloutKnobs(chunk_size=4, num_steps=1, guidance_scale=2.0, decode=False)
    session = model.open_session(first_frame(128, 128), PROMPT, arch.domain_id, knobs=knobs)
    session.step(action_chunks(1, arch)[0])  # committed context behind the prompt
    tables = [model.kv.page_table((session.session_id, label)) for label in session.labels]
    q_lens = [30, 20]
    batch = PagedAttentionBatch(model.kv, tables, q_lens, model.backend)
    config = model.transformer.config
    hidden = torch.randn(sum(q_lens), config.hidden_size)
    cos, sin = torch.randn(sum(q_lens), config.head_dim), torch.randn(sum(q_lens), config.head_dim)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:  # math sdpa: counted bmm
        gen_forward(model.transformer, hidden, cos, sin, batch)
    expected = forward_flops(GenShape.from_config(config), [(q, t.seq_len + q) for q, t in zip(q_lens, tables)])
    session.close()
    assert expected.total == counter.get_total_flops()
    assert expected.attention > 0 and expected.mlp > 0 and expected.projections > 0


def test_interleave_rotates_and_drops_warmup():
    calls: list[str] = []
    samples = interleave({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=2, warmup=1)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert [len(s.seconds) for s in samples.values()] == [2, 2]


def test_pages_flat_allows_page_flooring_but_not_growth():
    assert pages_flat([19, 20, 19, 20, 19, 20])
    assert not pages_flat([19, 20, 21, 22])


def test_bad_flags_exit_with_a_message(capsys):
    with pytest.raises(SystemExit):
        main(["vector", "--sizes", "one,two"])
    assert "comma list of int" in capsys.readouterr().err
