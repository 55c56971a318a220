"""Parity with the pipeline's action interface: one window through worldstep, opened with an embodiment and a
resolution tier, equals `Cosmos3OmniPipeline` called with `CosmosActionCondition(domain_name=..., raw_actions=...)`
on the same tiny weights and a non-square first frame that the pipeline pads onto its canvas."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cosmos3_tiny import tiny_architecture
from diffusers import Cosmos3OmniPipeline
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
from PIL import Image
from worldstep.engine.config import RolloutKnobs
from worldstep.engine.models.cosmos3.canvas import plan_first_frame
from worldstep.engine.models.cosmos3.checkpoint import build_checkpoint
from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel

BOUND = 1e-4  # tests/test_cosmos3_parity.py's bound

# (embodiment, raw width, first-frame size (h, w)): every size is off the multiple of 16 and off its bin's
# aspect, so the pipeline floors, resizes and pads it
CASES = [("droid_lerobot", 10, (120, 200)), ("agibotworld", 29, (200, 300)), ("pusht", 2, (300, 200))]


@pytest.fixture(scope="module", params=["edge", "nano"])
def checkpoint(request, tmp_path_factory):
    """The tiny architecture with a 32-wide action head, so that AgiBot's 29-wide actions fit."""
    arch = tiny_architecture(request.param)
    arch = arch.replace(transformer={**arch.transformer, "action_dim": 32})
    return build_checkpoint(tmp_path_factory.mktemp("ckpt") / f"tiny-{request.param}-a32", arch, seed=5)


@pytest.fixture(scope="module")
def pipeline(checkpoint):
    return Cosmos3OmniPipeline.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def model(checkpoint):
    return Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu")


@pytest.mark.parametrize(("name", "width", "size"), CASES, ids=[c[0] for c in CASES])
def test_one_window_matches_the_pipeline_for_the_embodiment(model, pipeline, name, width, size):
    emb = model.embodiments.get(name)
    plan = plan_first_frame(*size, tier=256)
    assert plan.pad_mode is not None and plan.floored != size  # the case really pads and floors
    image = np.random.RandomState(0).randint(0, 256, (*size, 3), dtype=np.uint8)
    actions = np.random.RandomState(1).uniform(-1, 1, (4, width)).astype(np.float32)
    prompt, negative, fps = "pick up the red cube", "blurry", emb.default_fps or 24.0  # the pipeline's default: 24
    condition = CosmosActionCondition(
        mode="forward_dynamics", chunk_size=4, domain_name=name, resolution_tier=256,
        raw_actions=torch.from_numpy(actions), image=Image.fromarray(image), view_point=emb.default_view_point)
    expected = pipeline(
        prompt=prompt, negative_prompt=negative, action=condition, num_inference_steps=3, guidance_scale=2.0,
        fps=fps, output_type="latent", generator=torch.Generator().manual_seed(7), enable_safety_check=False,
    ).video[0]  # [C, 2, h, w] on the content's latent grid

    knobs = RolloutKnobs(chunk_size=4, num_steps=3, guidance_scale=2.0, negative_prompt=negative, decode=False)
    with model.session(image, prompt, embodiment=name, knobs=knobs, generator=torch.Generator().manual_seed(7),
                       tier=256) as session:
        assert session.frame.plan == plan and session.conditioning.fps == fps
        assert tuple(session.first_latent.shape[-2:]) == plan.latent_size == tuple(expected.shape[-2:])
        first = (session.first_latent - expected[:, :1]).abs().max().item()
        got = model.step([session], [actions])[0].latents
    diff = (got - expected[:, 1:]).abs().max().item()
    print(f"{name}: max |worldstep - diffusers| = {diff:.2e} (first latent {first:.2e})")  # shown with -s
    assert first <= BOUND and diff <= BOUND, (first, diff)
    assert got.abs().max() > 0.1  # a real signal, not zeros
    assert model.kv.num_used_pages == 0


def test_sessions_of_different_grids_step_together_as_separate_groups(model):
    """Two canvases in one `step` call: each equals the same session stepped alone."""
    knobs = RolloutKnobs(chunk_size=4, num_steps=2, decode=False)
    images = [np.random.RandomState(s).randint(0, 256, (*size, 3), dtype=np.uint8)
              for s, size in ((1, (120, 200)), (2, (300, 200)))]
    actions = np.random.RandomState(3).uniform(-1, 1, (4, 10)).astype(np.float32)

    def open_(image):
        return model.open_session(image, "go", embodiment="droid_lerobot", knobs=knobs,
                                  generator=torch.Generator().manual_seed(4), tier=256)

    pair = [open_(image) for image in images]
    together = model.step(pair, [actions, actions])
    alone = []
    for image in images:
        with model.session(image, "go", embodiment="droid_lerobot", knobs=knobs,
                           generator=torch.Generator().manual_seed(4), tier=256) as s:
            alone.append(model.step([s], [actions])[0])
    for a, b in zip(together, alone):
        assert a.latents.shape == b.latents.shape and torch.equal(a.latents, b.latents)  # one group each: same calls
    assert together[0].latents.shape[-2:] != together[1].latents.shape[-2:]
    for s in pair:
        model.close(s)
