"""`DecoderOptions.batch_sessions`: the sessions of one decode call stacked into one set of decoder calls, their
caches stacked along the batch and split back; exactness bound, grouping, cap, failure and release."""

from __future__ import annotations

import pytest
import torch
from tiny_world import assert_frames_match_batched
from vae_models import (
    CallRecorder,
    diffusers_frames,
    random_latents,
    session_pixels,
    tiny_wan21,
    tiny_wan22,
)
from worldstep.engine.vae import DecoderOptions
from worldstep.engine.vae.cache import slot_tensors
from worldstep.engine.vae.decoder import WarmWanDecoder
from worldstep.engine.vae.jobs import BATCHED_DECODE_ATOL
from worldstep.engine.vae.session import DecodePath

VAE = tiny_wan22(seed=2)
GRID = (2, 2)
STACKED = DecoderOptions(batch_sessions=True)


def _windows(dec, sessions, z, pattern):
    """Decode ``z[i]`` on ``sessions[i]`` window by window in one `decode_batch` per window: pixels per session."""
    out, start = [[] for _ in sessions], 0
    for w in pattern:
        got = dec.decode_batch(sessions, [z[i : i + 1, :, start : start + w] for i in range(len(sessions))],
                               output="pixels")
        for mine, window in zip(out, got):
            mine.append(window)
        start += w
    return [torch.cat(mine, dim=2) for mine in out]


def test_stacked_sessions_issue_the_calls_of_one_batched_reference():
    """Sessions started together are the batch of one session-by-session reference at batch 3: the same calls with the
    same shapes, so bit for bit (by construction), and one decoder call per latent for all of them."""
    z = random_latents(6, GRID, seed=1, batch=3)
    dec = WarmWanDecoder(VAE, STACKED)
    sessions = [dec.open_session() for _ in range(3)]
    rec = CallRecorder(dec._decoder)
    got = _windows(dec, sessions, z, [1, 3, 2])
    rec.remove()
    assert rec.calls == [(3, 1, True)] + [(3, 1, False)] * 5  # one call per latent for the group, batch 3
    assert torch.equal(torch.cat(got), session_pixels(VAE, z))
    assert all(s.path is DecodePath.WARM and s.latents_decoded == 6 for s in sessions)


@pytest.mark.exactness
@pytest.mark.parametrize("family", [tiny_wan22, tiny_wan21], ids=["wan22", "wan21"])
@pytest.mark.parametrize("onednn", [False, True], ids=["reference", "onednn"])
def test_stacked_decode_is_within_the_bound_of_each_sessions_own_calls(family, onednn):
    vae, grid = family(seed=3), (2, 2) if family is tiny_wan22 else (4, 4)
    z = random_latents(7, grid, seed=4, batch=4)
    per, stacked = (WarmWanDecoder(vae, DecoderOptions(onednn_conv=onednn, batch_sessions=b)) for b in (False, True))
    want = _windows(per, [per.open_session() for _ in range(4)], z, [1, 3, 2, 1])
    got = _windows(stacked, [stacked.open_session() for _ in range(4)], z, [1, 3, 2, 1])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=BATCHED_DECODE_ATOL, rtol=0)
        assert_frames_match_batched(diffusers_frames(a), diffusers_frames(b))


def test_sessions_of_different_grids_or_states_never_share_a_call():
    z_small, z_big = random_latents(3, GRID, seed=5, batch=2), random_latents(3, (3, 3), seed=6)
    dec = WarmWanDecoder(VAE, STACKED)
    a, b, big, late = (dec.open_session() for _ in range(4))
    dec.decode_batch([a, b, big], [z_small[0:1, :, :1], z_small[1:2, :, :1], z_big[:, :, :1]])
    rec = CallRecorder(dec._decoder)
    # a and b are warm on one grid: one call; big is on another grid; late starts cold (first_chunk)
    out = dec.decode_batch([a, big, late, b], [z_small[0:1, :, 1:2], z_big[:, :, 1:2], z_small[1:2, :, :1],
                                               z_small[1:2, :, 1:2]], output="pixels")
    rec.remove()
    assert sorted(rec.calls) == sorted([(2, 1, False), (1, 1, False), (1, 1, True)])
    assert [o.shape[-2:] for o in out] == [(32, 32), (48, 48), (32, 32), (32, 32)]
    assert torch.equal(out[1], session_pixels(VAE, z_big[:, :, :2])[:, :, 1:])  # alone in its call: exact
    assert torch.equal(out[2], session_pixels(VAE, z_small[1:2, :, :1]))


def test_the_warm_cap_holds_with_stacked_decode_and_no_cache_is_lost():
    """With a cap of 2 warm caches, 3 sessions take the same paths as on the per-session path, their frames stay within
    the bound, each warm session keeps its own compact cache, and closing returns every slot and cache."""
    z = random_latents(5, GRID, seed=7, batch=3)
    decs = [WarmWanDecoder(VAE, DecoderOptions(batch_sessions=b, max_warm_sessions=2, context_latents=2))
            for b in (False, True)]
    sessions = [[dec.open_session() for _ in range(3)] for dec in decs]
    want, got = (_windows(dec, ss, z, [1, 2, 2]) for dec, ss in zip(decs, sessions))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=BATCHED_DECODE_ATOL, rtol=0)
    per, stacked = sessions
    assert [s.path for s in stacked] == [s.path for s in per] == [DecodePath.WARM] * 2 + [DecodePath.STATELESS]
    assert decs[1].live_warm_sessions == 2 and decs[1].cache_bytes(stacked[2]) == 0
    for s, p in zip(stacked[:2], per[:2]):  # each warm session kept its own compact cache: one batch row
        tensors = list(slot_tensors(s.slots))
        assert [t.shape for t in tensors] == [t.shape for t in slot_tensors(p.slots)] and tensors
        assert all(t.shape[0] == 1 and t.untyped_storage().nbytes() == t.nbytes for t in tensors)
        assert s.context.untyped_storage().nbytes() == s.context.nbytes
    for s in stacked:
        decs[1].close_session(s)
    assert decs[1].live_warm_sessions == 0
    assert all(decs[1].cache_bytes(s) == 0 and s.context is None and s.slots is None for s in stacked)


def test_a_failed_stacked_call_advances_no_session_and_the_retry_continues():
    z = random_latents(5, GRID, seed=9, batch=2)
    dec = WarmWanDecoder(VAE, STACKED)
    sessions = [dec.open_session() for _ in range(2)]
    head = _windows(dec, sessions, z, [2])
    rec = CallRecorder(dec._decoder, fail_on=2)  # the stacked run's second call raises
    with pytest.raises(RuntimeError, match="injected"):
        dec.decode_batch(sessions, [z[0:1, :, 2:5], z[1:2, :, 2:5]])
    rec.remove()
    assert all(s.slots is None and s.latents_decoded == 2 and s.frames_decoded == 5 for s in sessions)
    tail = _windows(dec, sessions, z[:, :, 2:], [3])  # both re-decode behind their whole context, stacked: exact
    assert torch.equal(torch.cat([torch.cat(head), torch.cat(tail)], dim=2), session_pixels(VAE, z))
    assert all(s.path is DecodePath.WARM and dec.cache_bytes(s) > 0 for s in sessions)


def test_batch_sessions_is_a_strict_switch():
    assert DecoderOptions().batch_sessions is False
    with pytest.raises(ValueError, match="batch_sessions"):
        DecoderOptions(batch_sessions="yes")
