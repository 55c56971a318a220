"""First-frame canvas: tier, aspect bin, resize, reflect/replicate padding and latent crop, equal to the pipeline's."""

from __future__ import annotations

from importlib.resources import files

import numpy as np
import pytest
import torch
import yaml
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
from PIL import Image
from worldstep.engine.models.cosmos3.canvas import (
    choose_tier,
    plan_first_frame,
    prepare_first_frame,
    resolution_bins,
)
from worldstep.engine.models.cosmos3.checkpoint import build_pipeline

BOUND = 1e-6  # measured 0 on the dev box; the pipeline interpolates chunk + 1 copies in one batch, we one


@pytest.fixture(scope="module")
def pipeline():
    arch = yaml.safe_load(files("worldstep.configs").joinpath("tiny.yaml").read_text())["model"]["architecture"]
    return build_pipeline(arch, seed=1)


def _image(height, width, seed=0):
    """A smooth, non-symmetric picture, so resizing and mirrored padding show up in every value."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([np.sin(x / 23.0 + c) * np.cos(y / 17.0 - c) for c in range(3)], axis=-1)
    noise = rng.uniform(-0.2, 0.2, (height, width, 3))
    return np.clip((base + noise) * 100 + 128, 0, 255).astype(np.uint8)


def _pipeline_canvas(pipeline, image, tier):
    frames, size, height, width = pipeline._prepare_action_video_conditioning(
        [image], tier, num_frames=5, device="cpu", dtype=torch.float32)
    return frames[:, :, 0], [int(v) for v in size.tolist()], (height, width)  # [1,3,H,W]


CASES = [  # (height, width, tier): what each exercises
    (480, 640, None),  # DROID's 640x480 at its own tier 480: bin 544x736, reflect padding
    (480, 640, 256),  # shrunk (bicubic, antialiased) into 256x320
    (490, 650, 480),  # floored to 480x640 first (PIL bilinear)
    (200, 1280, 256),  # a pad larger than the content: replicate
    (300, 200, 256),  # portrait
    (720, 1280, 720),  # exactly a bin: no padding
]


@pytest.mark.parametrize("height, width, tier", CASES)
def test_uint8_canvas_equals_the_pipelines(pipeline, height, width, tier):
    image = _image(height, width)
    got, plan = prepare_first_frame(image, tier=tier)
    expected, size, canvas = _pipeline_canvas(pipeline, Image.fromarray(image), tier or plan.tier)
    assert plan.canvas == canvas == tuple(got.shape[-2:])
    assert size == [*plan.canvas, *plan.content]
    diff = (got - expected).abs().max().item()
    print(f"{height}x{width} tier {plan.tier} bin {plan.canvas} content {plan.content} {plan.pad_mode}: "
          f"max |worldstep - pipeline| = {diff:.1e}")
    assert diff <= BOUND
    assert got.dtype == torch.float32 and got.min() >= -1.0 - 1e-3 and got.max() <= 1.0 + 1e-3


@pytest.mark.parametrize("height, width", [(480, 640), (490, 650)])
def test_float_canvas_equals_the_pipelines(pipeline, height, width):
    image = _image(height, width).astype(np.float32) / 255.0
    got, plan = prepare_first_frame(image)
    expected, _, _ = _pipeline_canvas(pipeline, image, plan.tier)
    assert (got - expected).abs().max().item() <= BOUND


@pytest.mark.parametrize("height, width, tier", [(480, 640, 256), (200, 1280, 256)])
def test_latent_crop_equals_the_pipelines(pipeline, height, width, tier):
    """The encoded canvas cropped by the plan is the clean latent frame 0 the pipeline denoises around."""
    image = _image(height, width, seed=2)
    canvas, plan = prepare_first_frame(image, tier=tier)
    condition = CosmosActionCondition(mode="forward_dynamics", chunk_size=4, domain_name="droid_lerobot",
                                      resolution_tier=tier, raw_actions=torch.zeros(4, 10),
                                      image=Image.fromarray(image))
    latents = pipeline.prepare_latents(image=None, num_frames=5, height=plan.canvas[0], width=plan.canvas[1],
                                       action=condition, generator=torch.Generator().manual_seed(0), device="cpu",
                                       dtype=torch.float32)[0]  # [1, C, T, lh, lw], frame 0 clean
    ours = plan.crop_latents(pipeline._encode_video(canvas.unsqueeze(2)))  # [1, C, 1, lh, lw]
    assert tuple(latents.shape[-2:]) == plan.latent_size == tuple(ours.shape[-2:])
    assert plan.output_size == (plan.latent_size[0] * 16, plan.latent_size[1] * 16)
    diff = (ours[:, :, 0] - latents[:, :, 0]).abs().max().item()
    print(f"{height}x{width} tier {tier}: latent grid {plan.latent_size}, max |diff| = {diff:.1e}")
    assert diff <= 1e-5


def test_plan_arithmetic():
    plan = plan_first_frame(480, 640)  # DROID's exterior camera
    assert (plan.tier, plan.canvas, plan.content, plan.pad_mode) == (480, (544, 736), (480, 640), "reflect")
    assert plan.latent_size == (30, 40) and plan.output_size == (480, 640) and plan.crop_box == (0, 0, 480, 640)
    assert plan.aspect_bin == "0.7391304347826086"
    assert plan_first_frame(720, 1280).pad_mode is None and plan_first_frame(720, 1280).tier == 720
    assert plan_first_frame(250, 250).tier == 256 and plan_first_frame(300, 2000).tier == 480
    shrunk = plan_first_frame(1080, 1920, tier=480)  # floored to 1072 rows, then shrunk to fit 480x832
    assert shrunk.floored == (1072, 1920) and shrunk.canvas == (480, 832)
    assert shrunk.content == (465, 832) and shrunk.latent_size == (29, 52) and shrunk.output_size == (464, 832)
    assert {choose_tier(s, 4000) for s in (16, 256, 257, 640, 641, 5000)} == {256, 480, 720}
    assert set(resolution_bins()) == {256, 480, 704, 720}
    latents = torch.zeros(1, 4, 2, 34, 46)
    assert plan.crop_latents(latents).shape == (1, 4, 2, 30, 40)
    with pytest.raises(ValueError, match="canvas grid \\(34, 46\\)"):
        plan.crop_latents(torch.zeros(1, 4, 2, 30, 40))


@pytest.mark.parametrize("image, tier, match", [
    (np.zeros((480, 640), np.uint8), None, "must be \\[H, W, 3\\]"),
    (np.zeros((8, 640, 3), np.uint8), None, "height=8 is invalid; allowed: an int >= 16"),
    (np.zeros((480, 640, 3), np.int32), None, "dtype must be uint8"),
    (np.full((480, 640, 3), 2.0, np.float32), None, "must lie in 0..1"),
    (np.zeros((480, 640, 3), np.uint8), 500, "tier=500 is invalid; allowed: one of \\[256, 480, 704, 720\\]"),
    (np.zeros((480, 640, 3), np.uint8), True, "tier=True is invalid"),
    ([[0, 0, 0]], None, "numpy array"),
])
def test_bad_first_frames_are_refused(image, tier, match):
    with pytest.raises(ValueError, match=match):
        prepare_first_frame(image, tier=tier)
