"""No decoder memory crosses CUDA streams unguarded, checked on a CPU with recording fakes of CUDA's streams.

The model decodes a session's first frame on the main stream and its windows on the decode lane; `decode` after
a step with ``decode=False`` runs on the main stream again. Every tensor a decode reads (the window's latents,
the decoder session's cache slots and retained context) may have been made, and last written, on the other stream: the
reading stream must wait for the event recorded after that write, and the tensor must be recorded on the reading
stream (`Tensor.record_stream`), or the caching allocator may hand its memory to the other stream's next work
while the reader still reads it. The fakes record waits, events and `record_stream` calls; with the guard
switched off (only here) the same check finds the unguarded tensors, so it cannot pass vacuously.
"""

from __future__ import annotations

from contextlib import contextmanager
from importlib.resources import files

import numpy as np
import pytest
import torch
import yaml
from worldstep.engine import lanes
from worldstep.engine.config import RolloutKnobs
from worldstep.engine.models.cosmos3.checkpoint import build_checkpoint
from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel
from worldstep.engine.vae import decoder as decoder_module
from worldstep.engine.vae.cache import session_tensors

IMAGE = np.random.RandomState(0).randint(0, 256, (64, 64, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    arch = yaml.safe_load(files("worldstep.configs").joinpath("tiny.yaml").read_text())["model"]["architecture"]
    return build_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", arch, seed=2)


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name, self.waited = name, []

    def wait_event(self, event) -> None:
        self.waited.append(event)

    def __repr__(self) -> str:
        return self.name


class FakeCuda:
    """Streams, events and `record_stream` as records; `current` is the stream work is queued on."""

    def __init__(self, monkeypatch) -> None:
        self.main, self.current, self.records = FakeStream("main"), None, []
        self.current = self.main
        cuda = self

        class FakeEvent:
            def __init__(self, *args, **kwargs) -> None:
                self.stream = None

            def record(self, stream=None) -> None:
                self.stream = stream or cuda.current

        @contextmanager
        def on_stream(stream):
            before, cuda.current = cuda.current, stream
            try:
                yield
            finally:
                cuda.current = before

        monkeypatch.setattr(lanes, "streams_enabled", lambda device: True)
        monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: cuda.current)
        monkeypatch.setattr(torch.cuda, "stream", on_stream)
        monkeypatch.setattr(torch.Tensor, "record_stream",
                            lambda t, stream: cuda.records.append((t.untyped_storage().data_ptr(), stream)))


@pytest.mark.parametrize("guard", [True, False], ids=["guarded", "guard-off"])
def test_every_tensor_a_decode_reads_is_waited_for_and_recorded_on_its_stream(checkpoint, monkeypatch, guard):
    model = Cosmos3WorldModel.from_pretrained(checkpoint, device="cpu", height=32, width=32, overlap_decode=True)
    cuda = FakeCuda(monkeypatch)
    lane = model.runner.lane.stream = FakeStream("lane")
    if not guard:
        monkeypatch.setattr(decoder_module, "hand_over", lambda *args: None)
    reads = []  # per decode call: the stream it ran on and, per decoder session, what it read and the prior write
    real = decoder_module.WarmWanDecoder._decode_locked

    def spy(self, sessions, windows, output):
        reads.append((cuda.current, [(z, session_tensors(s), s.written) for s, z in zip(sessions, windows)]))
        return real(self, sessions, windows, output)

    monkeypatch.setattr(decoder_module.WarmWanDecoder, "_decode_locked", spy)
    knobs = RolloutKnobs(num_steps=1, context_frames=2)
    sessions = [model.open_session(IMAGE, "go", 0, knobs=knobs, generator=torch.Generator().manual_seed(i))
                for i in range(4)]  # first frames: decoded on the main stream
    actions = [np.zeros((4, model.spec.action_dim), np.float32)] * 4
    for _ in range(2):
        model.step(sessions, actions)  # windows: decoded on the lane, in two halves
        assert any(e.stream is lane for e in cuda.main.waited)  # the frames are fetched after the lane's work
    late = model.step(sessions[:1], actions[:1], decode=False)[0]
    model.decode(sessions[0], late)  # on the main stream, after the lane wrote this session's cache

    assert {stream.name for stream, _ in reads} == {"main", "lane"}
    recorded, unguarded, unwaited = set(cuda.records), [], []
    for stream, per_session in reads:
        for z, held, written in per_session:
            unguarded += [t for t in [z, *held] if (t.untyped_storage().data_ptr(), stream) not in recorded]
            if written is not None and written.stream is not stream and written not in stream.waited:
                unwaited.append(written)
    if guard:
        assert unguarded == [] and unwaited == []
        assert sum(len(held) for _, per_session in reads for _, held, _ in per_session) > 0  # caches were read
    else:
        assert unguarded and unwaited  # the check sees what an unguarded decode leaves
    model.close_all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_8_sessions_with_decode_overlap_give_the_frames_of_the_same_sessions_decoded_in_turn(checkpoint):
    """On a GPU: 8 sessions stepped in halves, each half's decode on the lane while the other denoises, equal the
    same steps with every decode run in place on the main stream (no overlap). Same kernels, same shapes: latents
    exactly equal; frames within 1 uint8 level on at most 1e-3 of values (cuDNN may pick another algorithm). A
    race (memory reused while the lane still reads it) shows as frames far apart."""
    from tiny_world import assert_frames_match_batched

    def rollout(overlap: bool) -> list:
        model = Cosmos3WorldModel.from_pretrained(checkpoint, device="cuda", dtype=torch.bfloat16, height=32,
                                                  width=32, attention_backend="sdpa", overlap_decode=True)
        if not overlap:
            model.runner.lane.stream = None  # decodes run in turn on the main stream
        knobs = RolloutKnobs(num_steps=2, context_frames=2)
        sessions = [model.open_session(IMAGE, "go", 0, knobs=knobs, generator=torch.Generator().manual_seed(i))
                    for i in range(8)]
        rng = np.random.RandomState(5)
        steps = [model.step(sessions, [rng.uniform(-1, 1, (4, model.spec.action_dim)).astype(np.float32)
                                       for _ in sessions]) for _ in range(4)]
        model.close_all()
        assert model.kv.num_used_pages == 0 and model.decoder.live_warm_sessions == 0
        return steps

    sequential, overlapped = rollout(overlap=False), rollout(overlap=True)
    for step_a, step_b in zip(sequential, overlapped):
        for a, b in zip(step_a, step_b):
            assert torch.equal(a.latents, b.latents)
            assert_frames_match_batched(b.frames, a.frames)
