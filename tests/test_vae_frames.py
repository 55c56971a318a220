"""uint8 frame conversion against diffusers' VideoProcessor postprocess."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vae_models import diffusers_frames
from worldstep.engine.vae.frames import frames_from_pixels, frames_per_window


def _pixels(dtype: torch.dtype) -> torch.Tensor:
    """`[1, 3, T, H, W]`: random values, out-of-range values and exact half-level points."""
    g = torch.Generator().manual_seed(0)
    pixels = torch.rand(1, 3, 5, 8, 8, generator=g) * 2.4 - 1.2
    levels = torch.arange(256, dtype=torch.float64)
    halves = ((levels + 0.5) / 255 - 0.5) / 0.5  # (x/2 + 1/2) * 255 lands on k + 0.5
    flat = torch.cat([halves, torch.tensor([-1.0, 1.0, 0.0, -2.0, 2.0])])
    pixels.view(-1)[: flat.numel()] = flat.to(pixels.dtype)
    return pixels.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_frames_match_diffusers_postprocess(dtype):
    pixels = _pixels(dtype)
    got = frames_from_pixels(pixels)
    assert got.dtype == np.uint8 and got.shape == (5, 8, 8, 3)
    np.testing.assert_array_equal(got, diffusers_frames(pixels))
    np.testing.assert_array_equal(frames_from_pixels(pixels[0]), got)  # [3, T, H, W] too


def test_extremes_map_to_0_and_255():
    pixels = torch.tensor([-3.0, -1.0, 1.0, 3.0]).view(1, 1, 4, 1, 1).expand(1, 3, 4, 1, 1)
    assert frames_from_pixels(pixels)[:, 0, 0, 0].tolist() == [0, 0, 255, 255]


@pytest.mark.parametrize("shape", [(2, 3, 1, 4, 4), (1, 4, 1, 4, 4), (3, 4, 4), (1, 1, 3, 1, 4, 4)])
def test_frames_refuse_other_shapes(shape):
    with pytest.raises(ValueError, match="pixels"):
        frames_from_pixels(torch.zeros(shape))


def test_frames_per_window():
    assert [frames_per_window(w, first=True) for w in (1, 2, 8)] == [1, 5, 29]
    assert [frames_per_window(w, first=False) for w in (1, 2, 8)] == [4, 8, 32]
