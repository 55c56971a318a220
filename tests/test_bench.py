"""`worldstep bench`: every CPU subcommand end to end at toy sizes, its JSON, and the FLOP count.

No timing assertions: figures are only checked for structure and sanity (positive, finite ratios;
flat pages; pipelined frames equal to sequential ones), and the pieces the figures rest on (the recipe with
worldstep's kernels on its own VAE, the pipelined rollout) against what they stand in for.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from worldstep.bench import main
from worldstep.bench.measure import interleave
from worldstep.bench.report import (
    HEADLINE,
    generated_blocks,
    headline_table,
    load_docs,
    render_markdown,
    update,
)
from worldstep.bench.soak import pages_flat

FAST = ["--threads", "1", "--quiet"]
DECODE_TOY = ["--height", "32", "--width", "32", "--base-dim", "4", "--window-latents", "1,2", "--timed-windows", "3",
              "--context-latents", "2"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("bench-cache"))


def _run(tmp_path, name: str, *flags: str) -> dict:
    path = tmp_path / f"{name}.json"
    assert main([name, "--json", str(path), *FAST, *flags]) == 0
    doc = json.loads(path.read_text())  # strict JSON: NaN is written as null
    assert doc["bench"] == name and doc["schema"] == 1
    assert doc["machine"]["nproc"] >= 1 and doc["machine"]["torch_threads"] == 1
    assert doc["machine"]["run_cpu_s"] >= 0 and len(doc["machine"]["load_average_end"]) == 3
    for table in doc["tables"]:
        assert all(len(row) == len(table["columns"]) for row in table["rows"])
    return doc


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_rollout(tmp_path, cache, capsys):
    doc = _run(tmp_path, "rollout", "--archs", "tiny", "--rounds", "1", "--warmup", "1", "--num-steps", "1",
               "--scan-windows", "6", "--scan-span", "2", "--pipeline-windows", "2", "--pipeline-rounds", "1",
               "--cache-dir", cache)
    out = capsys.readouterr().out
    assert "(a) diffusers pipeline per chunk, as shipped" in out and "worldstep's kernels on its VAE" in out
    steps = doc["results"]["steps"]["tiny"]
    assert set(steps["ms_per_step"]) == {"official", "official_kernels", "kv"}
    assert [row[0][:3] for row in doc["tables"][0]["rows"]] == ["(a)", "(b)", "(c)"]  # three rows, one run
    assert all(_positive(v) for v in steps["ms_per_step"].values())
    ratios = [k for k in steps if "ratio" in k]
    assert len(ratios) == 8 and all(_positive(steps[k]) for k in ratios), ratios
    for name in ("official", "official_kernels"):  # the recipe re-encodes its conditioning clip every chunk
        assert steps["phases"][name]["encode_ms"] > 0 and steps["phases"][name]["encode_cpu_ms"] > 0
    assert steps["phases"]["kv"]["encode_ms"] == 0
    assert all(_positive(steps["phases"]["kv"][k]) for k in ("generate_cpu_ms", "decode_cpu_ms"))
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
        for mode in ("per_stream", "stacked"):  # both decode modes, side by side
            assert _positive(r["speedup_by_mode"][mode]) and _positive(r["steps_per_s"][f"batched_{mode}"])
            phases = r["phases_ms"][f"batched_{mode}"]
            assert set(phases) == {"denoise_ms", "commit_ms", "decode_ms", "other_ms"}
            # the phases of one call are its windows' shares: they add up to the call, never N times a phase
            assert sum(phases.values()) <= 1.05 * r["ms_per_call"][f"batched_{mode}"]
            assert 0 <= r["overhead_fraction"][f"batched_{mode}"] < 1
        if "vector_env" in r["steps_per_s"]:
            assert _positive(r["speedup_vector_env"])
        # latent mode in the same rounds, its own rows (that it makes no decoder call: tests/test_env_latents.py)
        assert _positive(r["latent_speedup"]) and _positive(r["steps_per_s"]["latent_separate"])
        assert _positive(r["latent_over_frames"]) and _positive(r["latent_speedup_vector_env"])
        assert set(r["phases_ms"]["latent_batched"]) == {"denoise_ms", "commit_ms", "decode_ms", "other_ms"}
    assert any(t["title"].startswith("Latent mode") for t in doc["tables"])


def test_vector_on_the_shipped_pusher_weights(tmp_path):
    doc = _run(tmp_path, "vector", "--arch", "pusher", "--sizes", "2", "--rounds", "1", "--warmup", "0",
               "--num-steps", "1", "--no-vector-env")
    assert doc["results"]["arch"] == "pusher" and (doc["results"]["height"], doc["results"]["width"]) == (64, 64)
    assert _positive(doc["results"]["by_n"][0]["speedup"])
    assert _positive(doc["results"]["by_n"][0]["latent_speedup"]) and doc["results"]["target_latent_speedup_at_8"]


def test_rollout_defaults_skip_the_long_scans():
    from worldstep.bench.settings import RolloutSettings

    defaults = RolloutSettings()
    assert defaults.archs == ["tiny", "small"] and defaults.scan_windows == 0 and defaults.pipeline_windows == 0


def test_official_recipe_comparison_refuses_a_model_without_the_droid_domain(tmp_path, capsys):
    from worldstep.cli import main

    assert main(["bench", "rollout", "--archs", "tiny,pusher", "--quiet"]) == 2  # refused before tiny runs
    assert "arch='pusher' is invalid for the official-recipe comparison" in capsys.readouterr().err


def test_recipe_with_worldstep_kernels_patches_its_own_vae_only(cache):
    """Row (b): the pipeline's own VAE runs worldstep's fast path, within the oneDNN bound of the stock recipe's
    frames; the stock pipeline (row (a)) and the checkpoint on disk are untouched."""
    from worldstep.bench.archs import PROMPT, action_chunks, bench_arch, checkpoint_for, first_frame
    from worldstep.bench.official import OfficialRecipe

    arch = bench_arch("tiny")
    image, actions = first_frame(256, 256), action_chunks(1, arch)[0]
    recipes = [OfficialRecipe(checkpoint_for(arch, cache), image=image, prompt=PROMPT, chunk_size=4, num_steps=1,
                              worldstep_kernels=fast) for fast in (False, True)]
    stock, fast = (r.pipeline.vae for r in recipes)
    patched = [m for m in fast.modules() if "forward" in vars(m)]
    assert patched and not any("forward" in vars(m) or "_conv_forward" in vars(m) for m in stock.modules())
    assert {type(m).__name__ for m in patched} == {"WanCausalConv3d", "WanRMS_norm"}
    assert any(m in patched for m in fast.encoder.modules())  # the whole VAE, encoder included
    frames = [r.step(actions)[0] for r in recipes]
    assert frames[0].shape == frames[1].shape == (4, 256, 256, 3)
    # oneDNN and the fused norm round differently (1e-4 on pixels in [-1, 1]); the uint8 frames stay within a level
    levels = np.abs(frames[0].astype(np.int16) - frames[1].astype(np.int16))
    assert levels.max() <= 1


def test_pipelined_rollout_equals_sequential_and_leaves_nothing_behind(cache):
    """The frames are the step loop's bit for bit: the same calls, only the decode runs on a worker thread."""
    from worldstep.bench.archs import action_chunks, bench_arch, load_model, open_session, rollout_knobs
    from worldstep.bench.pipelined import pipelined_rollout

    arch = bench_arch("tiny")
    model = load_model(arch, height=32, width=32, cache_dir=cache)
    knobs = rollout_knobs(arch, 1, 2)
    chunks = action_chunks(5, arch)
    outputs = []
    for pipelined in (False, True):
        session = open_session(model, arch, knobs, seed=4)
        if pipelined:
            outputs.append(list(pipelined_rollout(model, session, chunks)))
        else:
            outputs.append([model.step([session], [a])[0] for a in chunks])
        model.close(session)
    for a, b in zip(*outputs, strict=True):
        assert a.window_index == b.window_index and a.timings.decode_s > 0 < b.timings.decode_s
        assert np.array_equal(a.frames, b.frames)
    # leaving early waits for the decode in flight; the session then steps on, consistent
    session = open_session(model, arch, knobs, seed=4)
    windows = pipelined_rollout(model, session, chunks[:3])
    first = next(windows)
    windows.close()
    assert first.window_index == 0 and session.window_index == 2
    model.step([session], [chunks[2]])
    model.close(session)
    assert model.kv.num_used_pages == 0 and model.decoder.live_warm_sessions == 0 and model.live_sessions == 0


def test_a_failing_pipelined_rollout_closes_its_session(cache):
    from worldstep.bench.archs import action_chunks, bench_arch, load_model, open_session, rollout_knobs
    from worldstep.bench.pipelined import pipelined_rollout

    arch = bench_arch("tiny")
    model = load_model(arch, height=32, width=32, cache_dir=cache)
    session = open_session(model, arch, rollout_knobs(arch, 1, 2))
    bad = np.full((4, arch.action_width), np.nan, dtype=np.float32)
    with pytest.raises(ValueError, match="actions"):
        list(pipelined_rollout(model, session, [*action_chunks(2, arch), bad]))
    assert session.closed and model.kv.num_used_pages == 0 and model.live_sessions == 0


def test_soak_pages_flat(tmp_path, cache):
    doc = _run(tmp_path, "soak", "--windows", "40", "--rss-from", "10", "--num-steps", "1", "--cache-dir", cache)
    f = doc["results"]
    assert len(f["per_window"]) == 40
    assert f["pages_flat"] is True and f["pages_max_after_full"] - f["pages_min_after_full"] <= 1
    assert f["pool_pages_after_close"] == 0
    assert f["rss_mib_last"] > 0 and math.isfinite(f["rss_growth_pct"])


def test_decode(tmp_path):
    doc = _run(tmp_path, "decode", *DECODE_TOY)
    assert doc["results"]["warm_within_bound"] is True
    assert [r["latents_per_window"] for r in doc["results"]["rows"]] == [1, 2]
    assert all(_positive(r["stateless_over_warm"]) and _positive(r["whole_clip_over_warm"])
               for r in doc["results"]["rows"])
    headline = headline_table([doc])
    assert [row[0] for row in headline.rows][:2] == [
        "decode, 1 latents/window: stateless (2-latent context) / warm (in CPU time)",
        "decode, 1 latents/window: whole-clip re-decode (4..6 latents) / warm (in CPU time)"]


def test_gpu_without_cuda_exits_zero(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the real thing (tests/gpu/run_gpu_checks.sh)")
    doc = _run(tmp_path, "gpu")
    assert doc["results"]["skipped"] is True and "CUDA" in doc["notes"][0]


def test_gpu_code_path_on_cpu(tmp_path):
    doc = _run(tmp_path, "gpu", "--arch", "tiny", "--allow-cpu", "--steps", "1", "--guidance", "1,2",
               "--windows", "1", "--context-frames", "2", "--sections", "windows")
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
    assert "Top operators" in render_markdown(docs, headline=False)


def test_a_headline_taken_on_a_busy_box_is_refused(tmp_path):
    """The README's headline block comes only from runs that started at a 1-minute load <= 1.5: a busy one, or one
    without its load, is refused naming the bench and the load; the full tables still render."""
    def soak(load):
        machine = {"cpu": "x", "nproc": 2, **({} if load is None else {"load_average_start": [load, 1, 1]})}
        return {"bench": "soak", "machine": machine, "tables": [], "notes": [], "settings": {}, "results": {
            "windows": 40, "pages_min_after_full": 19, "pages_max_after_full": 20, "rss_from_window": 10,
            "rss_block_windows": 6, "rss_growth_pct": 0.5}}

    assert "19..20" in render_markdown([soak(1.5)], full=False)
    with pytest.raises(ValueError, match=r"idle box .*<= 1.5.*bench soak at load 8.7"):
        render_markdown([soak(1.0), soak(8.7)], full=False)
    with pytest.raises(ValueError, match=r"bench soak at load \(not recorded\)"):
        render_markdown([soak(None)])
    page = tmp_path / "page.md"
    page.write_text(f"{HEADLINE[0]}\nold\n{HEADLINE[1]}\n")
    with pytest.raises(ValueError, match="load 2"):
        update(page, [soak(2.0)])
    assert "old" in page.read_text()  # nothing written
    assert "soak" in render_markdown([soak(8.7)], headline=False)


def test_report_headline_from_documents():
    doc = {"bench": "soak", "machine": {"cpu": "x", "nproc": 2}, "tables": [], "notes": [], "results": {
        "windows": 40, "pages_min_after_full": 19, "pages_max_after_full": 20, "rss_from_window": 10,
        "rss_block_windows": 6, "rss_growth_pct": 0.5}}
    table = headline_table([doc])
    assert table.rows[0][1] == "19..20" and table.rows[1][1] == "0.50%"


def test_readme_and_performance_tables_are_generated_from_docs_bench():
    root = Path(__file__).parent.parent
    docs = load_docs(sorted((root / "docs" / "bench").glob("*.json")))
    assert {d["bench"] for d in docs} >= {"rollout", "decode", "vector", "soak", "profile", "gpu"}
    for (begin, end), body in generated_blocks(docs).items():
        files = [p for p in (root / "README.md", root / "docs" / "performance.md") if begin in p.read_text()]
        assert len(files) == 1, begin
        block = files[0].read_text().split(begin, 1)[1].split(end, 1)[0]
        assert block == f"\n{body}", (f"{files[0].name} is stale: python -m worldstep.bench.report docs/bench/*.json "
                                      "--update README.md --update docs/performance.md")


def test_report_update_rewrites_only_the_generated_blocks(tmp_path):
    doc = {"bench": "soak", "machine": {"cpu": "x", "nproc": 2, "load_average_start": [1.0, 2, 1]}, "tables": [],
           "notes": [], "settings": {}, "results": {"windows": 40, "pages_min_after_full": 19,
                                                    "pages_max_after_full": 20, "rss_from_window": 10,
                                                    "rss_block_windows": 6, "rss_growth_pct": 0.5}}
    page = tmp_path / "page.md"
    page.write_text(f"intro\n{HEADLINE[0]}\nold\n{HEADLINE[1]}\noutro\n")
    assert update(page, [doc]) is True and update(page, [doc]) is False
    text = page.read_text()
    assert text.startswith("intro\n") and text.endswith(f"{HEADLINE[1]}\noutro\n") and "old" not in text
    assert "| soak 40 windows: KV pages after context full | 19..20 | flat |" in text and "load average" in text
    (tmp_path / "plain.md").write_text("no markers")
    with pytest.raises(ValueError, match="no generated block"):
        update(tmp_path / "plain.md", [doc])


def test_gen_flops_match_torch_flop_counter(cache):
    """The analytic count equals torch's FlopCounterMode on the engine's own generation forward."""
    from worldstep.bench.archs import action_chunks, bench_arch, load_model, open_session, rollout_knobs
    from worldstep.bench.flops import GenShape, forward_flops
    from worldstep.engine.attention import PagedAttentionBatch
    from worldstep.engine.models.cosmos3.layers import gen_forward

    arch = bench_arch("tiny")
    model = load_model(arch, cache_dir=cache)
    session = open_session(model, arch, rollout_knobs(arch, 1, 0, guidance_scale=2.0, decode=False))
    model.step([session], [action_chunks(1, arch)[0]])  # committed context behind the prompt
    tables = [model.kv.page_table(key) for key in session.keys]
    q_lens = [30, 20]
    batch = PagedAttentionBatch(model.kv, tables, q_lens, model.backend)
    config = model.transformer.config
    hidden = torch.randn(sum(q_lens), config.hidden_size)
    cos, sin = torch.randn(sum(q_lens), config.head_dim), torch.randn(sum(q_lens), config.head_dim)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:  # math sdpa: counted bmm
        gen_forward(model.transformer, hidden, cos, sin, batch)
    expected = forward_flops(GenShape.from_config(config), [(q, t.seq_len + q) for q, t in zip(q_lens, tables)])
    model.close(session)
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
