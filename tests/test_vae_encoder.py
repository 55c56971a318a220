"""`encode_first_frame` against the Cosmos3 pipeline's own preprocessing and `_encode_video`."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
    Cosmos3OmniPipeline,
    _preprocess_conditioning_image,
)
from vae_models import FAMILIES, tiny_wan22
from worldstep.engine.vae.decoder import WarmWanDecoder
from worldstep.engine.vae.encoder import encode_first_frame, preprocess_first_frame


def pipeline_latent(vae, image: np.ndarray, height: int, width: int) -> torch.Tensor:
    """What `Cosmos3OmniPipeline.prepare_latents` builds for a conditioning image (frame 0)."""
    pipe = SimpleNamespace(
        vae=vae,
        _vae_latents_mean=torch.tensor(vae.config.latents_mean, dtype=vae.dtype),
        _vae_latents_inv_std=1.0 / torch.tensor(vae.config.latents_std, dtype=vae.dtype),
    )
    frame = _preprocess_conditioning_image(image, height=height, width=width)  # [1,3,H,W]
    with torch.no_grad():
        return Cosmos3OmniPipeline._encode_video(pipe, frame.unsqueeze(2)).float()


def _images(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "uint8-downscale": rng.integers(0, 256, (40, 56, 3), dtype=np.uint8),
        "uint8-upscale-tall": rng.integers(0, 256, (24, 16, 3), dtype=np.uint8),
        "uint8-square": rng.integers(0, 256, (100, 100, 3), dtype=np.uint8),
        "float64": rng.random((48, 33, 3)),
        "float32-extremes": np.clip(rng.normal(0.5, 0.6, (37, 64, 3)), 0, 1).astype(np.float32),
    }


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("case", sorted(_images()))
def test_first_frame_latent_matches_the_pipeline(family, case):
    vae = FAMILIES[family][0]()
    image = _images()[case]
    height, width = (32, 64) if case == "uint8-upscale-tall" else (32, 32)
    got = encode_first_frame(vae, image, height, width)
    want = pipeline_latent(vae, image, height, width)
    s = vae.config.scale_factor_spatial
    assert got.shape == (1, vae.config.z_dim, 1, height // s, width // s) and got.dtype == torch.float32
    assert torch.equal(got, want)


@pytest.mark.parametrize("case", sorted(_images()))
def test_preprocessing_matches_the_pipeline(case):
    image = _images(1)[case]
    got = preprocess_first_frame(image, 48, 80)
    assert got.shape == (1, 3, 48, 80)
    assert torch.equal(got, _preprocess_conditioning_image(image, height=48, width=80))


def test_encoder_keeps_off_the_shared_vae_state_and_honours_slicing():
    vae = tiny_wan22(seed=4)
    image = _images()["uint8-downscale"]
    vae.clear_cache()
    shared = (vae._feat_map, vae._enc_feat_map)
    got = encode_first_frame(vae, image, 32, 32)
    assert (vae._feat_map, vae._enc_feat_map) == shared and shared[0] is vae._feat_map
    vae.enable_slicing()  # diffusers' own encode path is used then
    assert torch.equal(encode_first_frame(vae, image, 32, 32), got)


def test_the_encoded_first_frame_decodes_to_one_frame():
    vae = tiny_wan22(seed=5)
    latent = encode_first_frame(vae, _images()["float64"], 32, 64)
    dec = WarmWanDecoder(vae)
    frames = dec.decode(dec.open_session(), latent)
    assert frames.shape == (1, 32, 64, 3) and frames.dtype == np.uint8


@pytest.mark.parametrize(
    ("image", "match"),
    [
        (np.zeros((32, 32), np.uint8), r"image.shape=\(32, 32\) is invalid; allowed: \(H, W, 3\)"),
        (np.zeros((32, 32, 4), np.uint8), r"\(32, 32, 4\)"),
        (np.zeros((4, 32, 3), np.uint8), r"image.shape=\(4, 32, 3\) is invalid; allowed: .* H, W >= 16"),
        (np.zeros((32, 32, 3), np.int32), r"image.dtype=int32 is invalid; allowed: uint8 \(0..255\) or float"),
        (np.full((32, 32, 3), np.nan, np.float32), "NaN"),
        (np.full((32, 32, 3), 1.5, np.float32), r"float values in \[1.5, 1.5\] .*allowed: finite values in \[0, 1\]"),
        (np.full((32, 32, 3), -0.1, np.float64),
         r"float values in \[-0.1, -0.1\] .*allowed: finite values in \[0, 1\]"),
        (torch.zeros(32, 32, 3), "numpy array"),
    ],
)
def test_bad_images_are_refused_naming_image(image, match):
    vae = tiny_wan22()
    with pytest.raises(ValueError, match="image") as err:
        encode_first_frame(vae, image, 32, 32)
    assert err.match(match)


@pytest.mark.parametrize(("height", "width"), [(24, 32), (32, 0), (32.0, 32), (True, 32), (-16, 32)])
def test_sizes_must_be_multiples_of_the_spatial_factor(height, width):
    vae = tiny_wan22()
    with pytest.raises(ValueError, match="height|width") as err:
        encode_first_frame(vae, np.zeros((32, 32, 3), np.uint8), height, width)
    assert err.match("multiple of 16")
