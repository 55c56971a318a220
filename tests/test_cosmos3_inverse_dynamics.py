"""Parity of Cosmos3's inverse dynamics (engine/models/cosmos3/inverse_dynamics.py) with diffusers'
`Cosmos3OmniPipeline` in its ``"inverse_dynamics"`` action mode, on tiny random weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cosmos3_tiny import tiny_checkpoint
from diffusers import Cosmos3OmniPipeline
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
from PIL import Image
from worldstep.engine.models.cosmos3 import inverse_dynamics as invdyn
from worldstep.engine.models.cosmos3.inverse_dynamics import ActionQuery, clip_pixels, encode_clip, infer_actions
from worldstep.engine.models.cosmos3.loader import load_components
from worldstep.engine.models.cosmos3.prompt import tokenize_action_prompt

DROID = ActionQuery(domain_id=8, action_width=10, fps=24.0)  # diffusers' "droid_lerobot": domain 8, 10 wide
PROMPT, NEGATIVE, CHUNK, STEPS, SEED = "pick up the red cube", "blurry, static", 8, 4, 7
# max |worldstep - diffusers| over the inferred actions (values up to ~3): measured <= 6e-7 on the CPU in
# float32 (edge and nano, guidance 1 and 3); the bound leaves room for other CPU kernels.
ATOL = 1e-5


@pytest.fixture(scope="module", params=["edge", "nano"])
def checkpoint(request, tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / f"tiny-{request.param}", request.param)


@pytest.fixture(scope="module")
def pipeline(checkpoint):
    return Cosmos3OmniPipeline.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def components(checkpoint):
    return load_components(checkpoint)


@pytest.fixture(scope="module")
def frames():
    return np.random.RandomState(0).randint(0, 256, (CHUNK + 1, 256, 256, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def diffusers_unguided(pipeline, frames):
    """The pipeline's answer at guidance 1, computed once per shape for the tests that compare against it."""
    return _diffusers(pipeline, frames, 1.0)


def _diffusers(pipeline, frames, guidance):
    condition = CosmosActionCondition(mode="inverse_dynamics", chunk_size=CHUNK, domain_name="droid_lerobot",
                                      resolution_tier=256, video=[Image.fromarray(f) for f in frames])
    out = pipeline(prompt=PROMPT, negative_prompt=NEGATIVE, action=condition, num_inference_steps=STEPS,
                   guidance_scale=guidance, output_type="latent", generator=torch.Generator().manual_seed(SEED),
                   enable_safety_check=False)
    return out.video, out.action[0]  # [C, 1 + CHUNK/4, h, w] (every frame a condition), [CHUNK, 10]


def _worldstep(components, frames, guidance, query=DROID):
    pixels, plan = clip_pixels(frames, tier=256)
    latents = plan.crop_latents(encode_clip(components.vae, pixels))  # [C, 1 + CHUNK/4, h, w]
    ids = tokenize_action_prompt(components.tokenizer, PROMPT, NEGATIVE, view_point="ego_view",
                                 num_frames=CHUNK + 1, fps=query.fps, height=plan.canvas[0], width=plan.canvas[1])
    actions = infer_actions(components, latents, ids, query, chunk_size=CHUNK, num_steps=STEPS,
                            guidance_scale=guidance, generator=torch.Generator().manual_seed(SEED))
    return latents, actions


@pytest.mark.parametrize("guidance", [1.0, pytest.param(3.0, marks=pytest.mark.exactness)])
def test_inferred_actions_match_diffusers(pipeline, components, frames, guidance):
    """The same clip, prompt, seed and steps give the pipeline's inferred actions, and its conditioning latents."""
    expected_latents, expected = _diffusers(pipeline, frames, guidance)
    latents, got = _worldstep(components, frames, guidance)
    assert (latents - expected_latents).abs().max().item() <= ATOL
    diff = (got - expected).abs().max().item()
    print(f"guidance {guidance}: max |worldstep - diffusers| actions = {diff:.2e}")  # shown with -s
    assert got.shape == (CHUNK, DROID.action_width)
    assert diff <= ATOL, diff
    assert got.abs().max() > 0.1  # a real signal, not zeros


def _skip_vision_draw(monkeypatch):
    """The pipeline's discarded vision-noise draw goes missing: the action noise is another draw."""
    original, calls = torch.randn, []

    def randn(*args, **kwargs):
        calls.append(args)
        return None if len(calls) == 1 else original(*args, **kwargs)

    monkeypatch.setattr(invdyn.torch, "randn", randn)


# Each fault is a plausible slip of a port; each must move the actions far past ATOL, or the bound proves nothing.
FAULTS = {
    "timestep halved": lambda mp: mp.setattr(
        invdyn, "embed_timesteps", lambda tr, t, _f=invdyn.embed_timesteps: _f(tr, t / 2)),
    "vision condition dropped": lambda mp: mp.setattr(
        invdyn, "vision_tokens", lambda tr, x, n, temb, _f=invdyn.vision_tokens: _f(tr, x * 0, n, temb)),
    "vision noise not drawn": _skip_vision_draw,
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_parity_bound_catches_faults(diffusers_unguided, components, frames, fault, monkeypatch):
    """The parity test fails on an injected fault: the departure is orders of magnitude over ATOL."""
    _, expected = diffusers_unguided
    FAULTS[fault](monkeypatch)
    _, got = _worldstep(components, frames, 1.0)
    assert (got - expected).abs().max().item() > 100 * ATOL


def test_other_domain_infers_other_actions(components, frames):
    """The query's domain selects the action head's weights: the answer depends on it."""
    _, a = _worldstep(components, frames, 1.0)
    _, b = _worldstep(components, frames, 1.0, ActionQuery(3, 10, 24.0))
    assert (a - b).abs().max() > 100 * ATOL


@pytest.mark.parametrize("field, kwargs, match", [
    ("chunk_size", dict(chunk_size=0), "chunk_size=0"),
    ("num_steps", dict(num_steps=0), "num_steps=0"),
    ("latents", dict(chunk_size=4), r"latents of shape \(4, 3,"),
    ("action_width", dict(query=ActionQuery(8, 17, 24.0)), "query.action_width=17"),
    ("domain_id", dict(query=ActionQuery(32, 10, 24.0)), "query.domain_id=32"),
    ("fps", dict(query=ActionQuery(8, 10, 0.0)), "query.fps=0.0"),
    ("guidance_scale", dict(guidance_scale=0.5), "guidance_scale=0.5"),
])
def test_bad_arguments_name_the_argument(components, field, kwargs, match):
    latents = torch.zeros(4, 3, 16, 16)
    ids = tokenize_action_prompt(components.tokenizer, PROMPT, "", view_point="ego_view", num_frames=CHUNK + 1,
                                 fps=24.0, height=256, width=256)
    call = dict(query=DROID, chunk_size=CHUNK, num_steps=STEPS) | kwargs
    with pytest.raises(ValueError, match=match):
        infer_actions(components, latents, ids, call.pop("query"), **call)


def test_a_model_without_an_action_head_is_refused(components):
    class NoHead:
        config = type("Config", (), {"action_gen": False})()

    assert invdyn.has_inverse_dynamics(components.transformer)
    assert not invdyn.has_inverse_dynamics(NoHead())
    fake = type("Components", (), {"transformer": NoHead()})()
    with pytest.raises(ValueError, match="no action head"):
        infer_actions(fake, torch.zeros(4, 3, 16, 16), None, DROID, chunk_size=CHUNK, num_steps=STEPS)


def test_frames_must_be_uint8_clips():
    with pytest.raises(ValueError, match="frames of shape"):
        clip_pixels(np.zeros((9, 64, 64, 3), np.float32))
