"""Property tests: random bad inputs get a clear ValueError before any work; the session keeps working."""

from __future__ import annotations

from importlib.resources import files
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from worldstep.engine.config import RolloutKnobs
from worldstep.engine.models.cosmos3.checkpoint import build_checkpoint
from worldstep.engine.models.cosmos3.model import Cosmos3WorldModel

CHUNK, ACTION_DIM, DOMAINS = 4, 16, 32
IMAGE = np.random.RandomState(0).randint(0, 256, (64, 64, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def opened(tmp_path_factory):
    """A model and one session taking 2-wide actions."""
    arch = yaml.safe_load(files("worldstep.configs").joinpath("tiny.yaml").read_text())["model"]["architecture"]
    path = build_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", arch)
    model = Cosmos3WorldModel.from_pretrained(path, device="cpu", height=64, width=64)
    session = model.open_session(IMAGE, "go", 1, knobs=RolloutKnobs(num_steps=1, decode=False), action_width=2)
    yield SimpleNamespace(model=model, session=session)
    model.close(session)
    assert model.kv.num_used_pages == 0


def _good_actions():
    return np.zeros((CHUNK, 2), np.float32)


bad_shapes = st.one_of(
    st.tuples(st.integers(0, 9).filter(lambda n: n != CHUNK), st.integers(1, ACTION_DIM)),
    st.tuples(st.just(CHUNK), st.integers(ACTION_DIM + 1, 40)),
    st.tuples(st.just(CHUNK), st.just(0)),
    st.tuples(st.just(CHUNK), st.integers(1, ACTION_DIM).filter(lambda k: k != 2)),  # not the declared width
)
bad_actions = st.one_of(
    bad_shapes.flatmap(lambda shape: hnp.arrays(np.float32, shape, elements=st.floats(-1, 1, width=32))),
    hnp.arrays(np.float32, (CHUNK, 3), elements=st.sampled_from([np.nan, np.inf, -np.inf]) | st.floats(-1, 1, width=32))
    .filter(lambda a: not np.all(np.isfinite(a))),
    hnp.arrays(np.float32, st.sampled_from([(CHUNK,), (CHUNK, 2, 1), ()])),
    st.sampled_from(["left", None, {"a": 1}, 3.0]),
    hnp.arrays(st.sampled_from([np.bool_, np.dtype("U1")]), (CHUNK, 2)),
)


@settings(max_examples=40, deadline=None)
@given(actions=bad_actions)
def test_random_bad_actions(opened, actions):
    model, session = opened.model, opened.session
    index, seq_len = session.window_index, model.kv_stats(session).seq_len
    with pytest.raises(ValueError, match="actions"):
        model.step([session], [actions])
    assert (session.window_index, model.kv_stats(session).seq_len) == (index, seq_len)


bad_domains = st.one_of(
    st.integers(max_value=-1), st.integers(min_value=DOMAINS), st.floats(allow_nan=True), st.booleans(),
    st.text(max_size=3), st.none(), st.just(np.float64(2.0)), st.just(np.bool_(True)),
)


@settings(max_examples=40, deadline=None)
@given(domain_id=bad_domains)
def test_random_bad_domain_ids(opened, domain_id):
    model = opened.model
    pages = model.kv.num_used_pages
    with pytest.raises(ValueError, match="domain_id"):
        model.open_session(IMAGE, "go", domain_id)
    assert model.kv.num_used_pages == pages and model.live_sessions == 1


bad_images = st.one_of(
    hnp.arrays(np.uint8, st.sampled_from([(64, 64), (64, 64, 4), (8, 8, 3), (64, 64, 3, 1)])),
    hnp.arrays(np.float32, (32, 32, 3), elements=st.floats(1.5, 5, width=32)),
    hnp.arrays(np.float32, (32, 32, 3), elements=st.just(np.nan)),
    hnp.arrays(np.int64, (32, 32, 3)),
    st.sampled_from([None, "img.png", [[0, 0, 0]]]),
)


@settings(max_examples=30, deadline=None)
@given(image=bad_images)
def test_random_bad_images(opened, image):
    model = opened.model
    with pytest.raises(ValueError, match="image"):
        model.open_session(image, "go", 1)
    assert model.live_sessions == 1


@settings(max_examples=25, deadline=None)
@given(prompt=st.one_of(st.just(""), st.text(alphabet=" \t\n", max_size=5), st.integers(), st.none(),
                        st.just("x" * 20_001), st.lists(st.text(), max_size=2)))
def test_random_bad_prompts(opened, prompt):
    with pytest.raises(ValueError, match="prompt"):
        opened.model.open_session(IMAGE, prompt, 1)


def test_session_still_steps_after_all_the_rejections(opened):
    model, session = opened.model, opened.session
    before = session.window_index
    assert model.step([session], [_good_actions()])[0].window_index == before
    assert session.window_index == before + 1
