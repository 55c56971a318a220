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
