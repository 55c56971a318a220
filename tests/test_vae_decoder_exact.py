"""The warm streaming decoder against one `vae.decode` of the whole clip (engine/vae).

Two kinds of claim, each tested as what it is (docs/exactness.md):
- bit for bit (`torch.equal`) against `session_pixels`, a reference that issues exactly the calls a warm
  session issues, with the same shapes: window patterns, interleaving, forks and retries must not change a
  session's frames, and no kernel choice can differ between the two;
- within `WHOLE_DECODE_ATOL` against one whole-clip `vae.decode`, whose `post_quant_conv` runs over the whole
  clip and may round differently from the per-latent calls (a pointwise conv picks its kernel by shape).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vae_models import (
    BF16_WHOLE_DECODE_ATOL,
    FAMILIES,
    CallRecorder,
    assert_near_whole_decode,
    decode_windows,
    diffusers_frames,
    random_latents,
    raw_latents,
    session_pixels,
    stateless_pixels,
    tiny_wan22,
    whole_pixels,
)
from worldstep.engine.vae import DecoderOptions
from worldstep.engine.vae.cache import count_slots, slot_tensors
from worldstep.engine.vae.causal import run_decoder
from worldstep.engine.vae.decoder import WarmWanDecoder
from worldstep.engine.vae.frames import frames_per_window, pixels_from_decoder

PATTERNS = [[1], [5], [1, 4], [1, 1, 1, 1, 1], [3, 2], [2, 3], [4, 1], [2, 2, 1]]
# The patterns rerun under other CPU kernel selections (tests/test_cpu_kernels.py): a lone first latent,
# one latent per window, and a ragged tail.
EXACTNESS_PATTERNS = ([1, 4], [1, 1, 1, 1, 1], [2, 2, 1])
PATTERN_PARAMS = [
    pytest.param(p, marks=pytest.mark.exactness if p in EXACTNESS_PATTERNS else (), id="-".join(map(str, p)))
    for p in PATTERNS
]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    build, grid = FAMILIES[request.param]
    return build(), grid


@pytest.mark.parametrize("pattern", PATTERN_PARAMS)
def test_warm_windows_issue_the_session_calls_bit_for_bit(family, pattern):
    vae, grid = family
    z = random_latents(sum(pattern), grid, seed=len(pattern))
    dec = WarmWanDecoder(vae)
    session = dec.open_session()
    windows = decode_windows(dec, session, z, pattern)

    for i, (w, pixels) in enumerate(zip(pattern, windows)):
        assert pixels.shape[2] == frames_per_window(w, first=i == 0)
    assert torch.equal(torch.cat(windows, dim=2), session_pixels(vae, z))
    assert session.latents_decoded == sum(pattern)
    assert session.frames_decoded == 1 + 4 * (sum(pattern) - 1)


@pytest.mark.parametrize("pattern", PATTERN_PARAMS)
def test_warm_windows_equal_the_whole_clip_decode_within_the_bound(family, pattern):
    vae, grid = family
    z = random_latents(sum(pattern), grid, seed=len(pattern))
    dec = WarmWanDecoder(vae)
    windows = decode_windows(dec, dec.open_session(), z, pattern)
    assert_near_whole_decode(torch.cat(windows, dim=2), whole_pixels(vae, z))


@pytest.mark.exactness
def test_the_session_recurrence_is_vae_decode_given_the_whole_clip_post_quant_conv(family):
    """Fed the whole clip's `post_quant_conv` output, the per-latent decoder loop of a session is exactly
    `vae.decode` (the same decoder calls with the same shapes): all that separates the warm decode from
    the whole-clip decode is the per-latent `post_quant_conv`."""
    vae, grid = family
    z = random_latents(6, grid, seed=13)
    with torch.no_grad():
        x = vae.post_quant_conv(raw_latents(vae, z))  # [1,C,6,h,w] over the whole clip
        cache = [None] * count_slots(vae.decoder)
        calls = list(run_decoder(vae.decoder, x, cache, [1] * 6, from_first_latent=True))
    got = torch.cat([pixels_from_decoder(out, vae.config.patch_size) for out in calls], dim=2)
    assert torch.equal(got, whole_pixels(vae, z))


def test_uint8_frames_are_diffusers_postprocess_of_the_whole_clip(family):
    vae, grid = family
    z = random_latents(6, grid, seed=3)
    dec = WarmWanDecoder(vae)
    session = dec.open_session()
    frames = [dec.decode(session, z[0, :, a:b]) for a, b in [(0, 1), (1, 4), (4, 6)]]  # [C,t,h,w] windows

    got = np.concatenate(frames)
    assert got.dtype == np.uint8 and got.shape == (21, 32, 32, 3)
    np.testing.assert_array_equal(got, diffusers_frames(session_pixels(vae, z)))  # the same pixels, mapped alike


@settings(max_examples=10, deadline=None)
@given(pattern=st.lists(st.integers(1, 3), min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_any_window_pattern_is_exact_wan22(pattern, seed):
    vae = _WAN22
    z = random_latents(sum(pattern), (2, 2), seed=seed)
    dec = WarmWanDecoder(vae)
    windows = decode_windows(dec, dec.open_session(), z, pattern)
    assert torch.equal(torch.cat(windows, dim=2), session_pixels(vae, z))


_WAN22 = tiny_wan22(seed=1)


def test_non_square_grid_is_exact():
    vae = _WAN22
    z = random_latents(5, (2, 4), seed=9)  # 32 x 64 px
    dec = WarmWanDecoder(vae)
    windows = decode_windows(dec, dec.open_session(), z, [2, 3])
    assert windows[0].shape[-2:] == (32, 64)
    assert torch.equal(torch.cat(windows, dim=2), session_pixels(vae, z))


def test_two_interleaved_sessions_stay_independent(family):
    vae, grid = family
    za, zb = random_latents(6, grid, seed=11), random_latents(6, grid, seed=12)
    dec = WarmWanDecoder(vae)
    a, b = dec.open_session(), dec.open_session()
    got_a, got_b = [], []
    got_a.append(dec.decode_pixels(a, za[:, :, 0:2]))
    got_b.append(dec.decode_pixels(b, zb[:, :, 0:1]))
    vae.decode(torch.zeros_like(za))  # a whole-clip decode in between must not disturb the sessions
    got_b.append(dec.decode_pixels(b, zb[:, :, 1:4]))
    got_a.append(dec.decode_pixels(a, za[:, :, 2:6]))
    got_b.append(dec.decode_pixels(b, zb[:, :, 4:6]))

    assert torch.equal(torch.cat(got_a, dim=2), session_pixels(vae, za))
    assert torch.equal(torch.cat(got_b, dim=2), session_pixels(vae, zb))


def test_a_decode_batch_gives_each_session_exactly_its_lone_frames(family):
    """Sessions decoded together issue each session's own batch-1 calls, so a session's frames never depend on
    which sessions share the call (a batched conv may round differently: docs/exactness.md)."""
    vae, grid = family
    z = random_latents(6, grid, seed=5, batch=2)
    dec = WarmWanDecoder(vae)
    a, b = dec.open_session(), dec.open_session()
    rec = CallRecorder(dec._decoder)
    outs = [dec.decode_batch([a, b], [z[0:1, :, i:j], z[1:2, :, i:j]], output="pixels") for i, j in [(0, 2), (2, 6)]]
    rec.remove()

    assert all(batch == 1 for batch, _, _ in rec.calls) and len(rec.calls) == 12  # 6 latents x 2 sessions
    assert torch.equal(torch.cat([o[0] for o in outs], dim=2), session_pixels(vae, z[0:1]))
    assert torch.equal(torch.cat([o[1] for o in outs], dim=2), session_pixels(vae, z[1:2]))


def test_sessions_at_different_phases_or_lengths_run_in_turn():
    vae = _WAN22
    z = random_latents(8, (2, 2), seed=21, batch=3)
    dec = WarmWanDecoder(vae)
    a, b, c = dec.open_session(), dec.open_session(), dec.open_session()
    first_a = dec.decode_pixels(a, z[0:1, :, 0:2])
    rec = CallRecorder(dec._decoder)
    # a is steady; b starts (latent 0, first_chunk); c starts with a different window length.
    out = dec.decode_batch([a, b, c], [z[0:1, :, 2:4], z[1:2, :, 0:2], z[2:3, :, 0:3]], output="pixels")
    rec.remove()

    steady_a = [(1, 1, False)] * 2
    start_b = [(1, 1, True), (1, 1, False)]
    start_c = [(1, 1, True), (1, 1, False), (1, 1, False)]
    assert rec.calls == steady_a + start_b + start_c  # (batch, latents, first_chunk) per call
    assert torch.equal(torch.cat([first_a, out[0]], dim=2), session_pixels(vae, z[0:1, :, :4]))
    assert torch.equal(out[1], session_pixels(vae, z[1:2, :, :2]))
    assert torch.equal(out[2], session_pixels(vae, z[2:3, :, :3]))


@pytest.mark.parametrize("latents_per_call", [0, 2])
def test_grouped_calls_match_within_rounding_and_first_window_stays_per_latent(family, latents_per_call):
    vae, grid = family
    z = random_latents(9, grid, seed=7)
    dec = WarmWanDecoder(vae, DecoderOptions(latents_per_call=latents_per_call))
    session = dec.open_session()
    rec = CallRecorder(dec._decoder)
    windows = decode_windows(dec, session, z, [3, 4, 2])
    rec.remove()

    per_window = [t for _, t, _ in rec.calls]
    step = 4 if latents_per_call == 0 else latents_per_call
    assert per_window[:3] == [1, 1, 1]  # the first window runs one latent per call
    assert per_window[3:] == ([4, 2] if step == 4 else [2, 2, 2])
    assert_near_whole_decode(torch.cat(windows, dim=2), whole_pixels(vae, z))


def test_stateless_path_equals_the_context_redecode():
    vae = _WAN22
    k = 3
    z = random_latents(10, (2, 2), seed=31)
    dec = WarmWanDecoder(vae, DecoderOptions(warm_cache=False, context_latents=k))
    session = dec.open_session()
    pattern, start = [2, 2, 3, 3], 0
    for w in pattern:
        got = dec.decode_pixels(session, z[:, :, start : start + w])
        assert torch.equal(got, stateless_pixels(vae, z, start, w, k))
        assert dec.cache_bytes(session) == 0 and session.retained_latents == min(k, start + w)
        start += w
    assert dec.live_warm_sessions == 0
    # Past the context the stateless path is only an approximation of the whole clip, far outside rounding.
    assert (got - session_pixels(vae, z)[:, :, -12:]).abs().max() > 1e-3


def test_retained_context_is_bounded_and_compact():
    vae = _WAN22
    z = random_latents(12, (2, 2), seed=41)
    dec = WarmWanDecoder(vae, DecoderOptions(context_latents=5))
    session = dec.open_session()
    decode_windows(dec, session, z, [1, 4, 4, 3])
    assert session.retained_latents == 5
    assert session.context.untyped_storage().nbytes() == session.context.nbytes
    with torch.no_grad():  # the decoder inputs of the last 5 latents, one post_quant_conv call per latent
        want = torch.cat([vae.post_quant_conv(raw_latents(vae, z[:, :, i : i + 1])) for i in range(7, 12)], dim=2)
    assert torch.equal(session.context, want)


def test_denormalisation_is_z_times_std_plus_mean():
    vae = _WAN22
    z = random_latents(3, (2, 2), seed=51)
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        want = vae.decode(z * std + mean).sample
    dec = WarmWanDecoder(vae)
    got = torch.cat(decode_windows(dec, dec.open_session(), z, [3]), dim=2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_bf16_vae_issues_the_pipelines_bf16_calls():
    vae = tiny_wan22(seed=6).to(torch.bfloat16)
    z = random_latents(5, (2, 2), seed=61)  # float32, as the denoiser hands them over
    dec = WarmWanDecoder(vae, DecoderOptions(dtype=None))  # the VAE's own dtype ("auto" is float32 on a CPU)
    session = dec.open_session()
    got = torch.cat(decode_windows(dec, session, z, [1, 3, 1]), dim=2)
    # The pipeline de-normalises and decodes in the VAE dtype, then casts to the latents' dtype.
    assert got.dtype == torch.float32 and torch.equal(got, session_pixels(vae, z).to(torch.float32))
    assert all(t.dtype == torch.bfloat16 for t in slot_tensors(session.slots))
    # Against the whole-clip bf16 decode only post_quant_conv's rounding differs, at bf16 scale.
    want = whole_pixels(vae, z).to(torch.float32)
    torch.testing.assert_close(got, want, atol=BF16_WHOLE_DECODE_ATOL, rtol=0)
