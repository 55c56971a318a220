"""Parity of the Cosmos3 kv rollout with diffusers and with a dense page-free reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cosmos3_reference import dense_kv_rollout
from cosmos3_tiny import tiny_architecture, tiny_checkpoint
from diffusers import Cosmos3OmniPipeline
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
from PIL import Image
from worldstep.engine.config import RolloutKnobs
from worldstep.engine.models.cosmos3.checkpoint import build_checkpoint
from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel

DROID = 8  # diffusers' domain id of "droid_lerobot" (10-wide actions)


# Every parity test runs on an Edge-shaped (relu2, Nemotron norms) and a Nano-shaped (SwiGLU, RMSNorm,
# q/k norm on text) tiny checkpoint.
@pytest.fixture(scope="module", params=["edge", "nano"])
def checkpoint(request, tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / f"tiny-{request.param}", request.param)


@pytest.fixture(scope="module")
def pipeline(checkpoint):
    return Cosmos3OmniPipeline.from_pretrained(checkpoint)


def _image(size: int, seed: int = 0) -> np.ndarray:
    return np.random.RandomState(seed).randint(0, 256, (size, size, 3), dtype=np.uint8)


@pytest.mark.parametrize("guidance", [1.0, pytest.param(3.0, marks=pytest.mark.exactness)])
@pytest.mark.parametrize("chunk", [pytest.param(4, marks=pytest.mark.exactness), 8])
def test_one_window_matches_diffusers_pipeline(checkpoint, pipeline, guidance, chunk):
    """One window covering the whole clip reproduces Cosmos3OmniPipeline forward dynamics latents."""
    _assert_one_window_matches(checkpoint, pipeline, guidance, chunk)


def test_one_window_matches_with_a_system_prompt(tmp_path):
    """A checkpoint saved with `default_use_system_prompt` (model_index.json) is prompted the pipeline's way."""
    arch = tiny_architecture("nano").replace(pipeline={"default_use_system_prompt": True})
    folder = build_checkpoint(tmp_path / "tiny-nano-system", arch, seed=3)
    pipeline = Cosmos3OmniPipeline.from_pretrained(folder)
    assert pipeline.config.default_use_system_prompt is True
    _assert_one_window_matches(folder, pipeline, guidance=3.0, chunk=4)


def _assert_one_window_matches(checkpoint, pipeline, guidance, chunk):
    image, steps, negative = _image(256), 4, "blurry, static"
    actions = np.random.RandomState(1).uniform(-1, 1, (chunk, 10)).astype(np.float32)
    condition = CosmosActionCondition(
        mode="forward_dynamics", chunk_size=chunk, domain_name="droid_lerobot", resolution_tier=256,
        # A PIL image: the pipeline's numpy path skips the /255 for uint8 arrays (values up to 509).
        raw_actions=torch.from_numpy(actions), image=Image.fromarray(image),
    )
    expected = pipeline(
        prompt="pick up the red cube", negative_prompt=negative, action=condition, num_inference_steps=steps,
        guidance_scale=guidance, output_type="latent", generator=torch.Generator().manual_seed(7),
        enable_safety_check=False,
    ).video[0]  # [C, 1 + chunk/4, h, w]

    model = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=256, width=256)
    knobs = RolloutKnobs(chunk_size=chunk, num_steps=steps, guidance_scale=guidance, negative_prompt=negative,
                         decode=False)
    session = model.open_session(image, "pick up the red cube", DROID, knobs=knobs,
                                 generator=torch.Generator().manual_seed(7), action_width=10)
    got = model.step([session], [actions])[0].latents
    diff = (got - expected[:, 1:]).abs().max().item()
    print(f"guidance {guidance} chunk {chunk}: max |worldstep - diffusers| = {diff:.2e}")  # shown with -s
    assert diff <= 1e-4, diff
    assert got.abs().max() > 0.1  # a real signal, not zeros
    model.close(session)
    assert model.kv.num_used_pages == 0


@pytest.mark.parametrize("context_frames", [0, pytest.param(2, marks=pytest.mark.exactness)])
def test_multi_window_kv_matches_dense_reference(checkpoint, context_frames):
    """Paged kv mode equals a dense oracle with explicit eviction, including released pages."""
    model = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", page_size=16)
    knobs = RolloutKnobs(chunk_size=4, num_steps=3, context_frames=context_frames, decode=False)
    rng = np.random.RandomState(5)
    actions = [rng.uniform(-1, 1, (4, 7)).astype(np.float32) for _ in range(6)]
    session = model.open_session(_image(128), "push the block left", 3, knobs=knobs,
                                 generator=torch.Generator().manual_seed(11), action_width=7)
    got = [model.step([session], [a])[0].latents for a in actions]
    stats = model.kv_stats(session)

    from worldstep.engine.models.cosmos3.prompt import tokenize_action_prompt

    ids = tokenize_action_prompt(model.components.tokenizer, "push the block left", "", view_point="ego_view",
                                 num_frames=5, fps=model.spec.fps, height=128, width=128).cond
    expected, stream = dense_kv_rollout(
        model, ids, session.first_latent, actions, 3, num_steps=3, context_frames=context_frames,
        generator=torch.Generator().manual_seed(11),
    )
    worst = max((a - b).abs().max().item() for a, b in zip(got, expected))
    print(f"context {context_frames}: max |paged - dense| over 6 windows = {worst:.2e}")  # shown with -s
    for window, (a, b) in enumerate(zip(got, expected)):
        assert (a - b).abs().max().item() <= 1e-5, (window, (a - b).abs().max().item())
    assert stats.released_tokens == stream.released
    if context_frames:
        assert stats.released_tokens > 0  # retention really freed pages
    model.close(session)


def test_kv_windows_differ_from_independent_windows(checkpoint):
    """Committed context matters: window 1 depends on window 0's committed K/V."""
    model = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu")
    knobs = RolloutKnobs(chunk_size=4, num_steps=2, decode=False)
    a = np.zeros((4, 4), np.float32)
    s1 = model.open_session(_image(128), "go", 0, knobs=knobs, generator=torch.Generator().manual_seed(0),
                            action_width=4)
    s2 = model.open_session(_image(128, seed=9), "go", 0, knobs=knobs, generator=torch.Generator().manual_seed(0),
                            action_width=4)
    model.step([s1], [a]), model.step([s2], [a])
    r1, r2 = model.step([s1], [a])[0], model.step([s2], [a])[0]
    assert (r1.latents - r2.latents).abs().max() > 1e-5  # same noise + actions, different history
    model.close(s1), model.close(s2)
