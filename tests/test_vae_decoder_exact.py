"""The warm streaming decoder against one `vae.decode` of the whole stream (engine/vae)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vae_models import (
    FAMILIES,
    CallRecorder,
    decode_windows,
    diffusers_frames,
    random_latents,
    raw_latents,
    stateless_pixels,
    tiny_wan22,
    whole_pixels,
)
from worldstep.engine.vae import DecoderOptions, WarmWanDecoder, frames_per_window
from worldstep.engine.vae.cache import slot_tensors

PATTERNS = [[1], [5], [1, 4], [1, 1, 1, 1, 1], [3, 2], [2, 3], [4, 1], [2, 2, 1]]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    build, grid = FAMILIES[request.param]
    return build(), grid


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: "-".join(map(str, p)))
def test_warm_windows_are_the_whole_stream_decode_bit_for_bit(family, pattern):
    vae, grid = family
    z = random_latents(sum(pattern), grid, seed=len(pattern))
    dec = WarmWanDecoder(vae)
    stream = dec.open_stream()
    windows = decode_windows(dec, stream, z, pattern)

    for i, (w, pixels) in enumerate(zip(pattern, windows)):
        assert pixels.shape[2] == frames_per_window(w, first=i == 0)
    assert torch.equal(torch.cat(windows, dim=2), whole_pixels(vae, z))
    assert stream.latents_decoded == sum(pattern)
    assert stream.frames_decoded == 1 + 4 * (sum(pattern) - 1)


def test_uint8_frames_are_diffusers_postprocess_of_the_whole_stream(family):
    vae, grid = family
    z = random_latents(6, grid, seed=3)
    dec = WarmWanDecoder(vae)
    stream = dec.open_stream()
    frames = [dec.decode(stream, z[0, :, a:b]) for a, b in [(0, 1), (1, 4), (4, 6)]]  # [C,t,h,w] windows

    got = np.concatenate(frames)
    assert got.dtype == np.uint8 and got.shape == (21, 32, 32, 3)
    np.testing.assert_array_equal(got, diffusers_frames(whole_pixels(vae, z)))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=st.lists(st.integers(1, 3), min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_any_window_pattern_is_exact_wan22(pattern, seed):
    vae = _WAN22
    z = random_latents(sum(pattern), (2, 2), seed=seed)
    dec = WarmWanDecoder(vae)
    windows = decode_windows(dec, dec.open_stream(), z, pattern)
    assert torch.equal(torch.cat(windows, dim=2), whole_pixels(vae, z))


_WAN22 = tiny_wan22(seed=1)


def test_non_square_grid_is_exact():
    vae = _WAN22
    z = random_latents(5, (2, 4), seed=9)  # 32 x 64 px
    dec = WarmWanDecoder(vae)
    windows = decode_windows(dec, dec.open_stream(), z, [2, 3])
    assert windows[0].shape[-2:] == (32, 64)
    assert torch.equal(torch.cat(windows, dim=2), whole_pixels(vae, z))


def test_two_interleaved_streams_stay_independent(family):
    vae, grid = family
    za, zb = random_latents(6, grid, seed=11), random_latents(6, grid, seed=12)
    dec = WarmWanDecoder(vae)
    a, b = dec.open_stream(), dec.open_stream()
    got_a, got_b = [], []
    got_a.append(dec.decode_pixels(a, za[:, :, 0:2]))
    got_b.append(dec.decode_pixels(b, zb[:, :, 0:1]))
    vae.decode(torch.zeros_like(za))  # a whole-clip decode in between must not disturb the streams
    got_b.append(dec.decode_pixels(b, zb[:, :, 1:4]))
    got_a.append(dec.decode_pixels(a, za[:, :, 2:6]))
    got_b.append(dec.decode_pixels(b, zb[:, :, 4:6]))

    assert torch.equal(torch.cat(got_a, dim=2), whole_pixels(vae, za))
    assert torch.equal(torch.cat(got_b, dim=2), whole_pixels(vae, zb))


def test_batched_pair_equals_the_stacked_whole_stream_decode(family):
    vae, grid = family
    z = random_latents(6, grid, seed=5, batch=2)
    dec = WarmWanDecoder(vae)
    a, b = dec.open_stream(), dec.open_stream()
    rec = CallRecorder(dec._decoder)
    outs = [dec.decode_batch([a, b], [z[0:1, :, i:j], z[1:2, :, i:j]], output="pixels") for i, j in [(0, 2), (2, 6)]]
    rec.remove()

    assert all(batch == 2 for batch, _, _ in rec.calls)  # one call sequence for both streams
    stacked = whole_pixels(vae, z)
    assert torch.equal(torch.cat([o[0] for o in outs], dim=2), stacked[0:1])
    assert torch.equal(torch.cat([o[1] for o in outs], dim=2), stacked[1:2])
    # Against each stream decoded alone only the batch-size kernel choice differs (~1e-6).
    torch.testing.assert_close(torch.cat([o[0] for o in outs], dim=2), whole_pixels(vae, z[0:1]), atol=1e-5, rtol=0)


def test_streams_at_different_phases_or_lengths_are_split():
    vae = _WAN22
    z = random_latents(8, (2, 2), seed=21, batch=3)
    dec = WarmWanDecoder(vae)
    a, b, c = dec.open_stream(), dec.open_stream(), dec.open_stream()
    first_a = dec.decode_pixels(a, z[0:1, :, 0:2])
    rec = CallRecorder(dec._decoder)
    # a is steady; b starts (latent 0, first_chunk); c starts with a different window length.
    out = dec.decode_batch([a, b, c], [z[0:1, :, 2:4], z[1:2, :, 0:2], z[2:3, :, 0:3]], output="pixels")
    rec.remove()

    steady_a = [(1, 1, False)] * 2
    start_b = [(1, 1, True), (1, 1, False)]
    start_c = [(1, 1, True), (1, 1, False), (1, 1, False)]
    assert rec.calls == steady_a + start_b + start_c  # (batch, latents, first_chunk) per call
    assert torch.equal(torch.cat([first_a, out[0]], dim=2), whole_pixels(vae, z[0:1, :, :4]))
    assert torch.equal(out[1], whole_pixels(vae, z[1:2, :, :2]))
    assert torch.equal(out[2], whole_pixels(vae, z[2:3, :, :3]))


@pytest.mark.parametrize("latents_per_call", [0, 2])
def test_grouped_calls_match_within_rounding_and_first_window_stays_per_latent(family, latents_per_call):
    vae, grid = family
    z = random_latents(9, grid, seed=7)
    dec = WarmWanDecoder(vae, DecoderOptions(latents_per_call=latents_per_call))
    stream = dec.open_stream()
    rec = CallRecorder(dec._decoder)
    windows = decode_windows(dec, stream, z, [3, 4, 2])
    rec.remove()

    per_window = [t for _, t, _ in rec.calls]
    step = 4 if latents_per_call == 0 else latents_per_call
    assert per_window[:3] == [1, 1, 1]  # the first window runs one latent per call
    assert per_window[3:] == ([4, 2] if step == 4 else [2, 2, 2])
    torch.testing.assert_close(torch.cat(windows, dim=2), whole_pixels(vae, z), atol=1e-5, rtol=0)


def test_stateless_path_equals_the_context_redecode():
    vae = _WAN22
    k = 3
    z = random_latents(10, (2, 2), seed=31)
    dec = WarmWanDecoder(vae, DecoderOptions(warm_cache=False, context_latents=k))
    stream = dec.open_stream()
    pattern, start = [2, 2, 3, 3], 0
    for w in pattern:
        got = dec.decode_pixels(stream, z[:, :, start : start + w])
        assert torch.equal(got, stateless_pixels(vae, z, start, w, k))
        assert dec.cache_bytes(stream) == 0 and stream.retained_latents == min(k, start + w)
        start += w
    assert dec.live_warm_streams == 0
    # Past the context the stateless path is only an approximation of the whole stream.
    assert not torch.equal(got, whole_pixels(vae, z)[:, :, -12:])


def test_retained_context_is_bounded_and_compact():
    vae = _WAN22
    z = random_latents(12, (2, 2), seed=41)
    dec = WarmWanDecoder(vae, DecoderOptions(context_latents=5))
    stream = dec.open_stream()
    decode_windows(dec, stream, z, [1, 4, 4, 3])
    assert stream.retained_latents == 5
    assert stream.context.untyped_storage().nbytes() == stream.context.nbytes
    with torch.no_grad():
        want = vae.post_quant_conv(raw_latents(vae, z[:, :, -5:]))
    assert torch.equal(stream.context, want)


def test_denormalisation_is_z_times_std_plus_mean():
    vae = _WAN22
    z = random_latents(3, (2, 2), seed=51)
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        want = vae.decode(z * std + mean).sample
    dec = WarmWanDecoder(vae)
    got = torch.cat(decode_windows(dec, dec.open_stream(), z, [3]), dim=2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_bf16_vae_is_exact_against_the_pipelines_bf16_decode():
    vae = tiny_wan22(seed=6).to(torch.bfloat16)
    z = random_latents(5, (2, 2), seed=61)  # float32, as the denoiser hands them over
    mean = torch.tensor(vae.config.latents_mean, dtype=torch.bfloat16).view(1, -1, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std, dtype=torch.bfloat16).view(1, -1, 1, 1, 1)
    with torch.no_grad():  # the pipeline: decode in the VAE dtype, then .to(latents dtype)
        want = vae.decode(z.to(torch.bfloat16) / inv_std + mean).sample.to(torch.float32)
    dec = WarmWanDecoder(vae)
    stream = dec.open_stream()
    got = torch.cat(decode_windows(dec, stream, z, [1, 3, 1]), dim=2)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert all(t.dtype == torch.bfloat16 for t in slot_tensors(stream.slots))
