"""What `bench gpu`'s headline figures mean, checked on the CPU at tiny size (their values are the GPU's).

- Windows are timed at full context: warm-up windows fill it first, so every timed window attends to one
  context length (up to the page the next release frees), not the growing context of windows 1 and 2.
- "N sessions" is ONE forward of N: the engine's decode overlap splits a group in halves (two forwards per
  step), so the bench turns it off and counts the transformer's forwards per window, which shows a split.
"""

from __future__ import annotations

import pytest
import torch
from worldstep.bench.archs import bench_arch
from worldstep.bench.gpu import run_gpu
from worldstep.bench.gpu_model import edge_model
from worldstep.bench.gpu_sessions import measure_sessions
from worldstep.bench.inmemory import build_components
from worldstep.bench.progress import Progress
from worldstep.bench.settings import GpuSettings

CPU = torch.device("cpu")
QUIET = Progress("gpu", quiet=True)


@pytest.fixture(scope="module")
def tiny():
    arch = bench_arch("tiny")
    return arch, build_components(arch, CPU, torch.float32, vae_dtype=torch.float32)


def test_windows_are_timed_at_full_context(tiny):
    settings = GpuSettings(arch="tiny", allow_cpu=True, sections=["windows"], steps=[1], guidance=[1.0],
                           windows=3, context_frames=2)
    run = run_gpu(settings, QUIET).results["runs"][0]
    assert run["full_context"] is True and run["warm_up_windows"] >= 2  # window 0 alone does not fill it
    assert run["timed_windows"] == 3 == len(run["windows"])
    page_size = tiny[0].page_size
    contexts = [w["context_tokens"] for w in run["windows"]]
    assert run["context_tokens_spread"] == max(contexts) - min(contexts) < page_size, contexts


def test_n_sessions_take_one_forward_of_n_and_a_split_would_show(tiny):
    arch, components = tiny
    settings = GpuSettings(arch="tiny", allow_cpu=True, sessions=[1, 2], session_steps=1, windows=1)
    bench_model = edge_model(components, arch, CPU, "sdpa")
    assert bench_model.overlap_decode is False
    rows = measure_sessions(bench_model, arch, settings, QUIET)
    assert [r["one_forward_of_n"] for r in rows] == [True, True]
    assert rows[0]["forwards_per_window"] == rows[1]["forwards_per_window"] > 0
    from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel

    split = Cosmos3WorldModel(components, device=CPU, page_size=arch.page_size, attention_backend="sdpa",
                              overlap_decode=True)  # what CUDA does by default: halves
    rows = measure_sessions(split, arch, settings, QUIET)
    assert rows[1]["forwards_per_window"] > rows[0]["forwards_per_window"] and rows[1]["one_forward_of_n"] is False


def test_overlap_section_sets_one_forward_of_n_against_two_overlapped_halves():
    settings = GpuSettings(arch="tiny", allow_cpu=True, sections=["overlap"], sessions=[1, 2], session_steps=1,
                           windows=1)
    f = run_gpu(settings, QUIET).results["overlap"]
    assert f["sessions"] == 2 and f["forwards_halves"] == 2 * f["forwards_one"] > 0
    assert f["ms_one_forward"] > 0 and f["ms_overlapped_halves"] > 0
    assert f["overlap_wins"] == (f["ms_overlapped_halves"] < f["ms_one_forward"])


def test_cadence_reports_first_frames_percentiles_and_aggregate_real_time_factor():
    settings = GpuSettings(arch="tiny", allow_cpu=True, sections=["cadence"], session_steps=1, windows=1,
                           context_frames=2, cadence_windows=4)
    result = run_gpu(settings, QUIET).results
    c = result["cadence"]
    assert c["timed_windows"] == 16 and c["full_context"] is True  # never fewer than 16, whatever was asked
    assert 0 < c["reset_s"] < c["time_to_first_frames_s"]
    assert 0 < c["inter_window_p50_ms"] <= c["inter_window_p95_ms"] <= c["inter_window_max_ms"]
    assert c["real_time_factor_n1"] > 0 and c["mfu"] is None  # no peak on a CPU: no MFU claimed
    assert c["aggregate"]["sessions"] == 8 and c["aggregate"]["aggregate_real_time_factor"] == pytest.approx(
        8 * c["aggregate"]["per_session_real_time_factor"])
    assert result["device"] == "cpu" and result["device_name"] == "cpu"


def test_a_failed_section_is_recorded_and_the_next_still_reports(monkeypatch):
    """flashinfer's modules missing, injected into the backends section: its error is in the figures, the overlap
    section after it still reports, and the bench exits 1 (the CLI) rather than losing the run."""
    from worldstep.bench import gpu

    def missing(*args, **kwargs):
        raise RuntimeError("flashinfer modules missing (injected)")

    monkeypatch.setattr(gpu, "_measure_backends", missing)
    settings = GpuSettings(arch="tiny", allow_cpu=True, sections=["backends", "overlap"], sessions=[1, 2],
                           session_steps=1, windows=1)
    result = run_gpu(settings, QUIET).results
    assert result["errors"] == {"backends": "RuntimeError: flashinfer modules missing (injected)"}
    assert "backends" not in result and result["overlap"]["forwards_one"] > 0
    assert set(result["section_s"]) == {"backends", "overlap"}


def test_a_section_whose_plan_does_not_fit_is_skipped_with_the_reason(monkeypatch):
    from worldstep.bench import gpu, gpu_memory

    monkeypatch.setattr(gpu_memory, "free_device_bytes", lambda device: 10 * 2**30)
    real = gpu_memory.section_plan

    def plan(section, model, settings):
        doc = real(section, model, settings)
        return {**doc, "plan_bytes": 100 * 2**30} if section == "sessions" else doc

    monkeypatch.setattr(gpu, "section_plan", plan)
    settings = GpuSettings(arch="tiny", allow_cpu=True, sections=["sessions", "windows"], steps=[1], guidance=[1.0],
                           windows=1, context_frames=2, sessions=[1])
    result = run_gpu(settings, QUIET).results
    assert result["skipped_sections"]["sessions"] == (
        "skipped: its plan needs 100.0 GiB (1 session(s)) and cpu has 10.0 GiB free")
    assert "sessions" not in result and result["runs"][0]["timed_windows"] == 1  # the next section ran
    assert result["memory"]["windows"]["plan_bytes"] > 0 and result["memory"]["windows"]["reasoned"] is True


def test_the_decode_plan_takes_each_decoder_stage_at_its_own_resolution():
    """The first H200 run skipped every decoding section: the plan took the widest stage's channels (1024) at the
    full frame, 98.8 GiB a 480p session. The widest stages run at the lowest resolution; the largest stage of
    Edge's decoder is its first, 256 channels at 240x416 (the frame over the VAE's patch size)."""
    from worldstep.session_memory import DECODE_COPIES, decoder_stage_elements

    arch = bench_arch("edge")
    vae = arch.architecture["vae"]
    largest = decoder_stage_elements(vae, arch.height, arch.width)
    assert largest == 2 * 256 * 240 * 416
    eight_sessions = 8 * DECODE_COPIES * 4 * largest * 4  # one latent (4 frames) per call, float32
    assert eight_sessions < 40 * 2**30, "8 decoding Edge sessions fit an H100 beside the weights"
