"""Session lifecycle of the warm decoder: cap, release, fork, failure and retry, switches, misuse."""

from __future__ import annotations

import copy
import gc
import threading

import pytest
import torch
from vae_models import (
    ONEDNN_ATOL,
    CallRecorder,
    assert_near_whole_decode,
    decode_windows,
    random_latents,
    session_pixels,
    stateless_pixels,
    tiny_wan21,
    tiny_wan22,
    whole_pixels,
)
from worldstep.engine.vae import DecoderOptions
from worldstep.engine.vae.cache import slot_tensors
from worldstep.engine.vae.decoder import WarmWanDecoder
from worldstep.engine.vae.session import DecodePath

VAE = tiny_wan22(seed=2)
GRID = (2, 2)


def _owns(t: torch.Tensor) -> bool:
    return t.untyped_storage().nbytes() == t.nbytes


# cap


def test_cap_makes_the_second_session_stateless_while_the_first_stays_warm():
    k = 2
    z = random_latents(7, GRID, seed=1, batch=2)
    dec = WarmWanDecoder(VAE, DecoderOptions(max_warm_sessions=1, context_latents=k))
    a, b = dec.open_session(), dec.open_session()
    got_a, start = [], 0
    for w in [1, 3, 3]:
        got_a.append(dec.decode_pixels(a, z[0:1, :, start : start + w]))
        got_b = dec.decode_pixels(b, z[1:2, :, start : start + w])
        assert torch.equal(got_b, stateless_pixels(VAE, z[1:2], start, w, k))
        start += w
    assert (a.path, b.path) == (DecodePath.WARM, DecodePath.STATELESS)
    assert torch.equal(torch.cat(got_a, dim=2), session_pixels(VAE, z[0:1]))
    assert dec.live_warm_sessions == 1 and dec.cache_bytes(a) > 0 and dec.cache_bytes(b) == 0

    dec.close_session(a)  # the slot frees; b never switches, a new session takes the slot
    assert dec.live_warm_sessions == 0
    dec.decode(b, random_latents(1, GRID, seed=9))
    assert b.path is DecodePath.STATELESS and dec.cache_bytes(b) == 0
    c = dec.open_session()
    dec.decode(c, random_latents(1, GRID, seed=10))
    assert c.path is DecodePath.WARM and dec.live_warm_sessions == 1


def test_cap_zero_means_no_cap():
    dec = WarmWanDecoder(VAE, DecoderOptions(max_warm_sessions=0))
    sessions = [dec.open_session() for _ in range(5)]
    for s in sessions:
        dec.decode(s, random_latents(1, GRID))
    assert dec.live_warm_sessions == 5 and all(s.path is DecodePath.WARM for s in sessions)


def test_an_aborted_session_frees_its_slot_for_the_next():
    dec = WarmWanDecoder(VAE, DecoderOptions(max_warm_sessions=1))
    with pytest.raises(RuntimeError, match="episode aborted"), dec.session() as s:
        dec.decode(s, random_latents(2, GRID))
        assert dec.live_warm_sessions == 1
        raise RuntimeError("episode aborted")
    assert s.closed and dec.live_warm_sessions == 0 and dec.cache_bytes(s) == 0 and s.context is None
    nxt = dec.open_session()
    dec.decode(nxt, random_latents(1, GRID))
    assert nxt.path is DecodePath.WARM


def test_warm_slots_are_counted_under_concurrency():
    dec = WarmWanDecoder(VAE, DecoderOptions(max_warm_sessions=3))
    sessions = [dec.open_session() for _ in range(8)]
    barrier = threading.Barrier(len(sessions))
    errors: list[BaseException] = []

    def first_window(s):
        try:
            barrier.wait()
            dec.decode(s, random_latents(1, GRID, seed=s.session_id))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=first_window, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sum(s.path is DecodePath.WARM for s in sessions) == 3 == dec.live_warm_sessions


# release


def test_close_releases_cache_context_and_slot():
    dec = WarmWanDecoder(VAE)
    sessions = [dec.open_session() for _ in range(3)]
    for s in sessions:
        dec.decode(s, random_latents(2, GRID))
    assert dec.live_warm_sessions == 3 and all(dec.cache_bytes(s) > 0 for s in sessions)
    for i, s in enumerate(sessions):
        dec.close_session(s)
        dec.close_session(s)  # idempotent
        assert dec.live_warm_sessions == 2 - i
        assert dec.cache_bytes(s) == 0 and s.context is None and s.context_bytes == 0
    with pytest.raises(ValueError, match="closed"):
        dec.decode(sessions[0], random_latents(1, GRID))


def test_a_dropped_session_gives_its_slot_back_when_collected():
    dec = WarmWanDecoder(VAE, DecoderOptions(max_warm_sessions=1))
    s = dec.open_session()
    dec.decode(s, random_latents(1, GRID))
    assert dec.live_warm_sessions == 1
    del s
    gc.collect()
    assert dec.live_warm_sessions == 0


# fork


def test_fork_then_diverge_keeps_both_exact():
    z = random_latents(7, GRID, seed=3)
    z_other = torch.cat([z[:, :, :3], random_latents(4, GRID, seed=4)], dim=2)
    dec = WarmWanDecoder(VAE)
    parent = dec.open_session()
    head = decode_windows(dec, parent, z, [1, 2])
    fork = dec.fork_session(parent)
    parent_slots = list(parent.slots)
    parent_values = [t.clone() for t in slot_tensors(parent.slots)]
    assert fork.path is DecodePath.WARM and dec.live_warm_sessions == 2
    assert fork.latents_decoded == 3 and fork.context is parent.context

    tail_fork = decode_windows(dec, fork, z_other, [2, 2], start=3)
    assert parent.slots == parent_slots  # the fork replaced its own slots only
    assert all(torch.equal(a, b) for a, b in zip(slot_tensors(parent.slots), parent_values))
    tail_parent = decode_windows(dec, parent, z, [4], start=3)

    assert torch.equal(torch.cat(head + tail_parent, dim=2), session_pixels(VAE, z))
    assert torch.equal(torch.cat(head + tail_fork, dim=2), session_pixels(VAE, z_other))
    dec.close_session(fork)
    assert dec.live_warm_sessions == 1 and parent.slots is not None


def test_fork_past_the_cap_is_stateless():
    k = 3
    z = random_latents(6, GRID, seed=5)
    dec = WarmWanDecoder(VAE, DecoderOptions(max_warm_sessions=1, context_latents=k))
    parent = dec.open_session()
    decode_windows(dec, parent, z, [1, 3])
    fork = dec.fork_session(parent)
    assert fork.path is DecodePath.STATELESS and dec.cache_bytes(fork) == 0
    got = dec.decode_pixels(fork, z[:, :, 4:6])
    assert torch.equal(got, stateless_pixels(VAE, z, 4, 2, k))


# failure and retry


def test_failed_window_drops_the_cache_and_the_retry_continues_warm():
    k = 2
    z = random_latents(9, GRID, seed=6)
    dec = WarmWanDecoder(VAE, DecoderOptions(context_latents=k))
    s = dec.open_session()
    head = decode_windows(dec, s, z, [1, 3])
    context_before = s.context
    rec = CallRecorder(dec._decoder, fail_on=2)  # the 2nd call of the next window raises
    with pytest.raises(RuntimeError, match="injected"):
        dec.decode(s, z[:, :, 4:7])
    rec.remove()
    assert s.slots is None and dec.cache_bytes(s) == 0  # the half-updated cache is gone
    assert s.latents_decoded == 4 and s.frames_decoded == 13 and s.context is context_before
    assert s.path is DecodePath.WARM and dec.live_warm_sessions == 1

    retry = dec.decode_pixels(s, z[:, :, 4:7])  # re-decodes behind its k context latents
    assert torch.equal(retry, stateless_pixels(VAE, z, 4, 3, k))
    assert dec.cache_bytes(s) > 0
    nxt = dec.decode_pixels(s, z[:, :, 7:9])  # then continues warm from the re-decoded cache
    assert torch.equal(nxt, session_pixels(VAE, z[:, :, 4 - k : 9])[:, :, -8:])
    assert torch.equal(torch.cat(head, dim=2), session_pixels(VAE, z[:, :, :4]))


def test_retry_with_context_covering_the_session_is_exact():
    z = random_latents(6, GRID, seed=7)
    dec = WarmWanDecoder(VAE, DecoderOptions(context_latents=8))
    s = dec.open_session()
    head = decode_windows(dec, s, z, [2])
    rec = CallRecorder(dec._decoder, fail_on=1)
    with pytest.raises(RuntimeError):
        dec.decode(s, z[:, :, 2:4])
    rec.remove()
    tail = decode_windows(dec, s, z, [2, 2], start=2)
    assert torch.equal(torch.cat(head + tail, dim=2), session_pixels(VAE, z))


def test_a_failed_batch_advances_no_session():
    z = random_latents(6, GRID, seed=8, batch=2)
    dec = WarmWanDecoder(VAE)
    steady, fresh = dec.open_session(), dec.open_session()
    head = dec.decode_pixels(steady, z[0:1, :, :2])
    # steady's group runs (and advances its cache in place), then fresh's first chunk raises.
    rec = CallRecorder(dec._decoder, fail_if_first_chunk=True)
    with pytest.raises(RuntimeError):
        dec.decode_batch([steady, fresh], [z[0:1, :, 2:4], z[1:2, :, 0:2]])
    rec.remove()
    assert steady.slots is None and steady.latents_decoded == 2
    assert fresh.latents_decoded == 0 and fresh.frames_decoded == 0

    out = dec.decode_batch([steady, fresh], [z[0:1, :, 2:4], z[1:2, :, 0:2]], output="pixels")
    assert torch.equal(torch.cat([head, out[0]], dim=2), session_pixels(VAE, z[0:1, :, :4]))
    assert torch.equal(out[1], session_pixels(VAE, z[1:2, :, :2]))


def test_a_group_that_never_ran_keeps_its_cache():
    z = random_latents(6, GRID, seed=9, batch=2)
    dec = WarmWanDecoder(VAE)
    fresh, steady = dec.open_session(), dec.open_session()
    head = dec.decode_pixels(steady, z[1:2, :, :2])
    slots = steady.slots
    rec = CallRecorder(dec._decoder, fail_if_first_chunk=True)  # fresh's group comes first and fails
    with pytest.raises(RuntimeError):
        dec.decode_batch([fresh, steady], [z[0:1, :, 0:1], z[1:2, :, 2:5]])
    rec.remove()
    assert steady.slots is slots and steady.latents_decoded == 2
    tail = dec.decode_pixels(steady, z[1:2, :, 2:5])
    assert torch.equal(torch.cat([head, tail], dim=2), session_pixels(VAE, z[1:2, :, :5]))


# storage and switches


@pytest.mark.parametrize("options", [DecoderOptions(), DecoderOptions(latents_per_call=0),
                                     DecoderOptions(channels_last=True), DecoderOptions(onednn_conv=True)],
                         ids=["per-latent", "per-window", "channels-last", "onednn"])
def test_cache_slots_own_their_storage(options):
    z = random_latents(6, GRID, seed=10, batch=2)
    dec = WarmWanDecoder(VAE, options)
    a, b = dec.open_session(), dec.open_session()
    for i, j in [(0, 1), (1, 3), (3, 6)]:
        dec.decode_batch([a, b], [z[0:1, :, i:j], z[1:2, :, i:j]])
        for s in (a, b):
            tensors = list(slot_tensors(s.slots))
            assert tensors and all(_owns(t) and t.shape[0] == 1 for t in tensors)
            assert _owns(s.context)
            assert dec.cache_bytes(s) == sum(t.nbytes for t in tensors)


def test_channels_last_matches_and_leaves_the_shared_vae_alone():
    vae = tiny_wan21(seed=3)
    z = random_latents(5, (4, 4), seed=11)
    dec = WarmWanDecoder(vae, DecoderOptions(channels_last=True))
    got = torch.cat(decode_windows(dec, dec.open_session(), z, [1, 2, 2]), dim=2)
    assert dec._decoder is not vae.decoder
    assert all(p.is_contiguous() for p in vae.parameters())
    assert_near_whole_decode(got, whole_pixels(vae, z))


def _conv_kernels(dec, session, z) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        dec.decode_pixels(session, z)
    return {e.key for e in prof.key_averages() if "conv" in e.key and ("slow" in e.key or "mkldnn" in e.key)}


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")
def test_onednn_conv_matches_within_rounding_runs_onednn_and_leaves_the_shared_vae_alone():
    vae = tiny_wan22(seed=4)
    z = random_latents(6, (4, 4), seed=12, batch=2)
    fast = WarmWanDecoder(vae, DecoderOptions(onednn_conv=True))
    a, b = fast.open_session(), fast.open_session()
    got_a, got_b, start = [], [], 0
    for w in (1, 2, 3):  # a batched pair, window by window
        pa, pb = fast.decode_batch([a, b], [z[0:1, :, start : start + w], z[1:2, :, start : start + w]],
                                   output="pixels")
        got_a.append(pa), got_b.append(pb)
        start += w
    for got, row in ((got_a, 0), (got_b, 1)):
        torch.testing.assert_close(torch.cat(got, dim=2), whole_pixels(vae, z[row : row + 1]), atol=ONEDNN_ATOL, rtol=0)
    # the per-latent convs run on oneDNN in the copy, on the reference kernel in the shared VAE's decoder
    assert fast._decoder is not vae.decoder
    assert not any("_conv_forward" in vars(m) for m in vae.decoder.modules())
    # Which kernel torch picks for the shared decoder is torch's heuristic (it may vary with the machine);
    # the copy's 3-D convs call oneDNN directly, never the reference kernel.
    kernels = _conv_kernels(fast, fast.open_session(), z[0:1, :, :1])
    assert "aten::mkldnn_convolution" in kernels and "aten::slow_conv3d_forward" not in kernels


def test_cudnn_benchmark_is_set_only_around_the_decode_and_restored_on_error():
    seen: list[bool] = []
    dec = WarmWanDecoder(VAE, DecoderOptions(cudnn_benchmark=True))
    handle = dec._decoder.register_forward_pre_hook(lambda m, a: seen.append(torch.backends.cudnn.benchmark))
    previous = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = False
        s = dec.open_session()
        dec.decode(s, random_latents(1, GRID))
        assert seen == [True] and torch.backends.cudnn.benchmark is False
        rec = CallRecorder(dec._decoder, fail_on=1)
        with pytest.raises(RuntimeError):
            dec.decode(s, random_latents(1, GRID))
        rec.remove()
        assert torch.backends.cudnn.benchmark is False
        # switched off, the decoder leaves the flag as the caller set it
        torch.backends.cudnn.benchmark = True
        off = WarmWanDecoder(VAE)
        off.decode(off.open_session(), random_latents(1, GRID))
        assert seen[-1] is True and torch.backends.cudnn.benchmark is True
    finally:
        handle.remove()
        torch.backends.cudnn.benchmark = previous


# misuse


def test_bad_latents_are_refused_before_any_work():
    dec = WarmWanDecoder(VAE)
    s = dec.open_session()
    dec.decode(s, random_latents(1, GRID))
    slots = s.slots
    bad = {
        "z_dim": torch.zeros(1, 3, 1, *GRID),
        "grid": torch.zeros(1, 4, 1, 4, 4),
        "batch": torch.zeros(2, 4, 1, *GRID),
        "empty": torch.zeros(1, 4, 0, *GRID),
        "nan": torch.full((1, 4, 1, *GRID), float("nan")),
        "ints": torch.zeros(1, 4, 1, *GRID, dtype=torch.int64),
    }
    for name, z in bad.items():
        with pytest.raises(ValueError, match="latents"):
            dec.decode(s, z)
        assert s.slots is slots and s.latents_decoded == 1, name


def test_sessions_refuse_misuse():
    dec, other = WarmWanDecoder(VAE), WarmWanDecoder(VAE)
    s = dec.open_session()
    with pytest.raises(ValueError, match="another WarmWanDecoder"):
        other.decode(s, random_latents(1, GRID))
    with pytest.raises(ValueError, match="twice"):
        dec.decode_batch([s, s], [random_latents(1, GRID)] * 2)
    with pytest.raises(ValueError, match="one latents tensor per session"):
        dec.decode_batch([s], [])
    # s.lock held: as if a decode of this session were running in another thread
    with s.lock, pytest.raises(ValueError, match="being decoded"):
        dec.decode(s, random_latents(1, GRID))
    assert s.latents_decoded == 0 and s.path is None


def test_decoder_dtype_runs_a_private_copy_in_that_dtype():
    vae = tiny_wan22(seed=6)  # float32, shared: it must stay so
    z = random_latents(5, GRID, seed=62)
    dec = WarmWanDecoder(vae, DecoderOptions(dtype="bfloat16"))
    session = dec.open_session()
    got = torch.cat(decode_windows(dec, session, z, [1, 3, 1]), dim=2)
    assert all(p.dtype == torch.float32 for p in vae.parameters()) and dec._decoder is not vae.decoder
    assert all(t.dtype == torch.bfloat16 for t in slot_tensors(session.slots))  # half the cache bytes
    # the calls of a bf16 decoder behind the float32 VAE's de-normalisation and post_quant_conv (the prelude stays
    # in the wider dtype), pixels handed back in the latents' dtype
    mixed = copy.deepcopy(vae)
    mixed.decoder.to(torch.bfloat16)
    reference = session_pixels(mixed, z, decoder_dtype=torch.bfloat16).to(torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got, reference)
    same = WarmWanDecoder(vae, DecoderOptions(dtype="float32"))
    assert same._decoder is vae.decoder  # the VAE's own dtype needs no copy
