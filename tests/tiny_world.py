"""Shared fixtures of the env/sdk/cli tests: the embedded tiny model, built once per test module.

``FAST`` shrinks the tiny config further (32x32 frames, one denoising step) so a window costs a fraction
of a second on CPU; everything else (checkpoint builder, loader, paged KV, warm decoder) is the real path.
"""

from __future__ import annotations

import numpy as np
import pytest
import worldstep

FAST = {"height": 32, "width": 32, "num_steps": 1}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A private WORLDSTEP_CACHE: loading builds the embedded checkpoint there."""
    path = tmp_path_factory.mktemp("worldstep_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORLDSTEP_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def world(cache_dir):
    """The tiny model with the FAST overrides, loaded once per module."""
    return worldstep.load("tiny", device="cpu", **FAST)


def zeros(space) -> np.ndarray:
    return np.zeros(space.shape, dtype=np.float32)


def ramp(space, scale: float = 0.5) -> np.ndarray:
    """A deterministic action chunk that differs from zeros."""
    return (scale * np.linspace(-1, 1, int(np.prod(space.shape)))).reshape(space.shape).astype(np.float32)


# Batched vs one-by-one engine steps (and so vector-env vs single-env frames): each row's attention and
# decoder calls are the ones it makes alone, but the linear layers run over every session's tokens packed
# into one matrix, and a GEMM may round differently with the row count. Latents agree within
# `BATCHED_LATENTS_ATOL` (measured: bit-identical on AMD EPYC and Intel Xeon under every kernel selection
# tests/test_cpu_kernels.py exercises); frames within 1 uint8 level on at most `BATCHED_FRAMES_FRACTION` of
# values. docs/exactness.md.
BATCHED_LATENTS_ATOL = 1e-5
BATCHED_FRAMES_FRACTION = 1e-3


def assert_frames_match_batched(got: np.ndarray, want: np.ndarray) -> None:
    """Frames of a batched step vs the same episode stepped alone, within the stated bound."""
    assert got.shape == want.shape and got.dtype == want.dtype == np.uint8
    levels = np.abs(got.astype(np.int16) - want.astype(np.int16))
    assert levels.max() <= 1, f"{int(levels.max())} levels apart"
    assert (levels > 0).mean() <= BATCHED_FRAMES_FRACTION, f"{(levels > 0).mean():.2e} of values differ"
