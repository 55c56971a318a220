"""Embodiments through the env and the engine: exact action spaces, per-embodiment fps and view point, refusals
before any model work, and the optional action-normalisation stage."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
import worldstep
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_world import cache_dir, ramp, world  # noqa: F401 - fixtures
from worldstep.engine.config import RolloutKnobs
from worldstep.engine.embodiment.action_normalizer import ActionNormalizer, ActionRangeWarning
from worldstep.engine.embodiment.action_stats import ActionStats
from worldstep.engine.embodiment.embodiments import EmbodimentRegistry
from worldstep.envs import NormalizeActions, WorldModelEnv, WorldModelVectorEnv, make_world_model_env


def counts(model) -> tuple[int, int, int]:
    return model.kv.num_used_pages, model.decoder.live_warm_sessions, model.live_sessions


@pytest.fixture
def no_model_work(world, monkeypatch):  # noqa: F811
    """Any prefill or first-frame encode fails the test: a refusal must come before both."""
    from worldstep.engine.models.cosmos3 import model as model_module

    def forbidden(*args, **kwargs):
        raise AssertionError("model work started before the refusal")

    monkeypatch.setattr(model_module, "prefill_text", forbidden)
    monkeypatch.setattr(model_module, "encode_session_frame", forbidden)
    return world


def test_env_takes_an_embodiment_name_with_its_exact_width_fps_and_view_point(world):  # noqa: F811
    env = worldstep.make_env(world, embodiment="droid_lerobot", max_windows=2)
    assert env.action_space == gym.spaces.Box(-1, 1, (4, 10), np.float32)
    assert (env.unwrapped.embodiment, env.unwrapped.domain_id) == ("droid_lerobot", 8)
    assert env.metadata["frame_fps"] == 15.0 and env.metadata["render_fps"] == 15.0 / 4
    env.reset(seed=0)
    session = env.unwrapped.episode.session
    assert session.action_shape == (4, 10) and session.domain_id == 8
    assert (session.conditioning.fps, session.conditioning.view_point) == (15.0, "concat_view")
    obs, _, _, _, info = env.step(ramp(env.action_space))
    assert obs["frames"].shape == (4, 32, 32, 3) and info["window_index"] == 0
    with pytest.raises(ValueError, match=r"actions.*\(4, 10\)"):  # the engine checks the exact width
        env.step(np.zeros((4, 16), np.float32))
    env.close()
    assert counts(world.model) == (0, 0, 0)


def test_a_domain_id_with_one_width_names_its_embodiment(world):  # noqa: F811
    env = WorldModelEnv(world.model, world.knobs, embodiment=8)  # droid_lerobot and robomind-franka: both 10
    assert (env.embodiment, env.action_space.shape) == ("droid_lerobot", (4, 10))
    with pytest.raises(ValueError, match=r"domain_id=5 is ambiguous.*\[7, 10, 13\].*libero_3d"):
        WorldModelEnv(world.model, world.knobs, embodiment=5)
    with pytest.raises(ValueError, match=r"domain_id=10 has no embodiment.*allowed names: \["):
        WorldModelEnv(world.model, world.knobs, embodiment=10)


@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"embodiment": "droid_lerobot", "action_width": 7},
     r"actions 7 wide do not fit embodiment 'droid_lerobot' \(domain 8, 10-wide actions\).*allowed names: \["),
    ({"embodiment": "droid"}, r"embodiment='droid' is unknown; allowed: \[.*'droid_lerobot'"),
    ({"embodiment": "libero"}, r"embodiment='libero' cannot drive.*libero_6d \(10\)"),
    ({"embodiment": "agibotworld"}, r"'agibotworld' \(domain 15, 29-wide actions\) is wider than this checkpoint's "
                                    r"action_dim=16; allowed: \["),
    ({"embodiment": "droid_lerobot", "domain_id": 7}, r"domain_id=7 contradicts embodiment 'droid_lerobot'"),
    ({"embodiment": "pusht", "fps": 0}, r"fps=0 is invalid; allowed: a number > 0"),
    ({"embodiment": 2.5}, r"embodiment=2.5 is invalid"),
])
def test_bad_embodiments_are_refused_before_any_model_work(no_model_work, kwargs, pattern):
    model = no_model_work.model
    with pytest.raises(ValueError, match=pattern):
        make_world_model_env(model, no_model_work.knobs, **kwargs)
    with pytest.raises(ValueError, match=pattern):
        model.open_session(np.zeros((32, 32, 3), np.uint8), "go", kwargs.get("domain_id"),
                           embodiment=kwargs["embodiment"], action_width=kwargs.get("action_width"),
                           fps=kwargs.get("fps"))
    assert counts(model) == (0, 0, 0)


def test_a_reset_domain_id_that_contradicts_the_embodiment_leaves_the_episode_alive(world):  # noqa: F811
    env = worldstep.make_env(world, embodiment="droid_lerobot")
    env.reset(seed=0)
    session = env.unwrapped.episode.session
    with pytest.raises(ValueError, match=r"domain_id=3 contradicts embodiment 'droid_lerobot'"):
        env.reset(options={"domain_id": 3})
    assert env.unwrapped.episode.session is session and env.unwrapped.episode.live  # nothing committed was lost
    env.reset(options={"domain_id": 8})  # its own id is fine
    env.close()


def test_the_embodiment_fps_and_view_point_reach_the_positions_and_caption(world):  # noqa: F811
    """An embodiment session equals a raw-domain session given the embodiment's fps and view point explicitly,
    and differs from one at the checkpoint's fps: the fps reaches the temporal RoPE."""
    model, image = world.model, np.random.RandomState(0).randint(0, 256, (32, 32, 3), np.uint8)
    actions = np.random.RandomState(1).uniform(-1, 1, (4, 10)).astype(np.float32)

    def latents(**kwargs) -> torch.Tensor:
        knobs = RolloutKnobs(num_steps=1, decode=False, view_point=kwargs.pop("view_point", None))
        with model.session(image, "go", knobs=knobs, generator=torch.Generator().manual_seed(3), **kwargs) as s:
            return model.step([s], [actions])[0].latents

    named = latents(embodiment="droid_lerobot")
    assert torch.equal(named, latents(domain_id=8, action_width=10, fps=15.0, view_point="concat_view"))
    at_24 = latents(domain_id=8, action_width=10, fps=24.0, view_point="concat_view")
    assert (named - at_24).abs().max() > 1e-4
    ego = latents(embodiment="droid_lerobot", view_point="ego_view")  # an explicit view point wins
    assert (named - ego).abs().max() > 1e-4
    assert torch.equal(latents(embodiment="droid_lerobot", fps=24.0), latents(domain_id=8, action_width=10,
                                                                              view_point="concat_view"))


def test_vector_env_and_config_take_the_embodiment(world):  # noqa: F811
    envs = WorldModelVectorEnv(world.model, 2, world.knobs, embodiment="bridge_orig_lerobot")
    assert envs.single_action_space.shape == (4, 10) and envs.metadata["frame_fps"] == 5.0
    envs.reset(seed=0)
    _, _, _, _, infos = envs.step(np.zeros((2, 4, 10), np.float32))
    assert list(infos["window_index"]) == [0, 0]
    with pytest.raises(ValueError, match=r"domain_id=8 contradicts embodiment 'bridge_orig_lerobot'"):
        envs.reset(options={"domain_id": [7, 8]})
    envs.close()
    # the tiny config sets domain_id 8: naming an embodiment brings its own id
    env = worldstep.make_env(world, embodiment="pusht")
    assert (env.unwrapped.domain_id, env.action_space.shape, env.metadata["frame_fps"]) == (4, (4, 2), 24.0)
    assert worldstep.load(world, embodiment="pusht").action_shape == (4, 2)
    env.close()
    with pytest.raises(ValueError, match=r"domain_id=7 contradicts"):
        worldstep.make_env(world, embodiment="pusht", domain_id=7)


_REGISTRY_NAMES = sorted(EmbodimentRegistry.default().names)


@settings(max_examples=60, deadline=None)
@given(name=st.one_of(st.none(), st.sampled_from(_REGISTRY_NAMES), st.sampled_from(["libero", "no_action", "DROID"]),
                      st.integers(-2, 40)),
       domain_id=st.one_of(st.none(), st.integers(-2, 40)), width=st.one_of(st.none(), st.integers(0, 70)))
def test_every_combination_is_accepted_exactly_when_the_checkpoint_fits_it(no_model_work, name, domain_id, width):
    """Every name round-trips through the env; every invalid combination is a ValueError before model work."""
    model = no_model_work.model
    records = list(model.embodiments)
    spec = model.spec
    embodiment = domain_id if name is None else name  # in the env a domain id stands for its embodiment
    if isinstance(embodiment, int):
        same = [e for e in records if e.domain_id == embodiment]
        found = same[0] if same and len({e.raw_width for e in same}) == 1 else None
    else:  # a name, or neither (the tiny checkpoint registers many embodiments: no default)
        found = next((e for e in records if e.name == embodiment), None)
    ok = (found is not None and domain_id in (None, found.domain_id) and width in (None, found.raw_width)
          and found.raw_width <= spec.action_dim)
    want = None if found is None else (found.domain_id, found.raw_width, found.name)
    try:
        env = make_world_model_env(model, no_model_work.knobs, embodiment=name, domain_id=domain_id,
                                   action_width=width)
    except ValueError as err:
        assert not ok, err
        if name is not None:  # the engine refuses the same combination (without one it takes a raw domain)
            with pytest.raises(ValueError):
                model.open_session(np.zeros((32, 32, 3), np.uint8), "go", domain_id, embodiment=name,
                                   action_width=width)
        if name is not None and isinstance(name, str) and width not in (None, getattr(found, "raw_width", None)):
            assert name in str(err) or "allowed" in str(err)
    else:
        assert ok, (name, domain_id, width)
        assert (env.unwrapped.domain_id, env.action_space.shape[1], env.unwrapped.embodiment) == want
        env.close()
    assert counts(model) == (0, 0, 0)


# --- the optional normalisation stage -------------------------------------------------------------

Q01 = np.linspace(-0.5, -0.05, 10).astype(np.float32)
Q99 = np.linspace(0.1, 0.8, 10).astype(np.float32)


def _normalizer(**kwargs) -> ActionNormalizer:
    return ActionNormalizer("quantile", ActionStats(q01=Q01, q99=Q99), width=10, **kwargs)


def test_the_normaliser_runs_before_the_engine_and_reports_in_info(world):  # noqa: F811
    raw_env = worldstep.make_env(world, embodiment="bridge_orig_lerobot", action_normalizer=_normalizer())
    plain = worldstep.make_env(world, embodiment="bridge_orig_lerobot")
    low, high = raw_env.action_space.low, raw_env.action_space.high
    assert np.array_equal(low[0], Q01) and np.array_equal(high[3], Q99)  # raw actions in the stats' range
    raw = np.random.RandomState(2).uniform(Q01, Q99, (4, 10)).astype(np.float32)
    raw_env.reset(seed=4), plain.reset(seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # inside the stats' range: no warning
        got = raw_env.step(raw)
    want = plain.step(2 * (raw - Q01) / (Q99 - Q01) - 1)  # what the normaliser should hand the engine
    np.testing.assert_allclose(got[0]["frames"], want[0]["frames"], atol=1)  # the same window within rounding
    assert (got[4]["actions_outside_stats"], got[4]["actions_clipped"]) == (0, 0)

    outside = raw.copy()
    outside[0, 3] = Q99[3] + 1.0  # beyond q99: normalised to > 1, passed through as in training
    with pytest.warns(ActionRangeWarning, match=r"1 raw action values lie outside.*dimensions \[3\]"):
        info = raw_env.step(outside)[4]
    assert (info["actions_outside_stats"], info["actions_clipped"]) == (1, 0)
    raw_env.close(), plain.close()

    clipping = worldstep.make_env(world, embodiment="bridge_orig_lerobot", action_normalizer=_normalizer(clip=True))
    clipping.reset(seed=0)
    with pytest.warns(ActionRangeWarning, match="clipped to"):
        info = clipping.step(outside)[4]
    assert (info["actions_outside_stats"], info["actions_clipped"]) == (1, 1)
    clipping.close()
    assert counts(world.model) == (0, 0, 0)


def test_the_normaliser_in_a_vector_env_reports_per_sub_env(world):  # noqa: F811
    envs = WorldModelVectorEnv(world.model, 2, world.knobs, embodiment="bridge_orig_lerobot",
                               action_normalizer=_normalizer())
    envs.reset(seed=0)
    raw = np.stack([np.broadcast_to(Q01, (4, 10)), np.broadcast_to(Q99, (4, 10))]).astype(np.float32)
    raw[1, 0, 0] = Q99[0] + 1.0
    with pytest.warns(ActionRangeWarning):
        _, _, _, _, infos = envs.step(raw)
    assert list(infos["actions_outside_stats"]) == [0, 1]
    envs.close()


def test_a_normaliser_of_another_width_is_refused(no_model_work):
    model, knobs = no_model_work.model, no_model_work.knobs
    with pytest.raises(ValueError, match=r"action_normalizer width=10 is invalid; allowed: 2"):
        make_world_model_env(model, knobs, embodiment="pusht", action_normalizer=_normalizer())
    with pytest.raises(ValueError, match=r"action_normalizer=.* is invalid; allowed: an ActionNormalizer"):
        NormalizeActions(WorldModelEnv(model, knobs, embodiment="pusht"), "quantile")
    env = NormalizeActions(WorldModelEnv(model, knobs, embodiment="bridge_orig_lerobot"), _normalizer())
    with pytest.raises(ValueError, match=r"actions shape \(4, 7\) is invalid; allowed: \[..., 10\]"):
        env.step_in(np.zeros((4, 7), np.float32))


# --- the pipeline's first-frame canvas ------------------------------------------------------------

def _frame(size, seed=0) -> np.ndarray:
    return np.random.RandomState(seed).randint(0, 256, (*size, 3), dtype=np.uint8)


def test_the_canvas_fixes_the_observation_to_the_content_and_crops_the_padding(world):  # noqa: F811
    from gymnasium.utils.env_checker import check_env
    from worldstep.engine.models.cosmos3.canvas import plan_first_frame

    plan = plan_first_frame(120, 200, tier=256)  # floored to 112x192, padded into the 192x320 bin
    env = gym.make("worldstep/Tiny-v0", model=world, embodiment="droid_lerobot", resolution_tier=256,
                   image=_frame((120, 200)), max_windows=2).unwrapped
    assert env.observation_space["frames"].shape == (4, 112, 192, 3) == (4, *plan.output_size, 3)
    obs, info = env.reset(seed=0)
    assert (info["resolution_tier"], info["aspect_bin"]) == (256, plan.aspect_bin)
    session = env.unwrapped.episode.session
    assert session.frame.caption_size == plan.canvas == (192, 320)  # the caption states the canvas
    assert tuple(session.first_latent.shape[-2:]) == (7, 12)  # the padding's latents are gone
    obs, _, _, _, info = env.step(ramp(env.action_space))
    assert obs["frames"].shape == (4, 112, 192, 3)
    obs, _ = env.reset(seed=1, options={"image": _frame((120, 200), seed=5)})  # same size, new content
    assert obs["frames"].shape == (4, 112, 192, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env)
    env.close()
    assert counts(world.model) == (0, 0, 0)


def test_a_reset_image_that_gives_another_canvas_is_refused_and_the_episode_lives(world):  # noqa: F811
    env = worldstep.make_env(world, embodiment="pusht", resolution_tier=256, image=_frame((120, 200)))
    env.reset(seed=0)
    session = env.unwrapped.episode.session
    with pytest.raises(ValueError, match=r"options\['image'\] of size 200x120 is invalid for this env's canvas "
                                         r"\(tier 256, aspect bin 0.6, 112x192 frames\).*allowed: .*120x200"):
        env.reset(options={"image": _frame((200, 120))})
    assert env.unwrapped.episode.session is session and env.unwrapped.episode.live
    env.close()
    envs = WorldModelVectorEnv(world.model, 2, world.knobs, embodiment="pusht", resolution_tier=256,
                               image=_frame((120, 200)))
    with pytest.raises(ValueError, match=r"options\['image'\] of size 64x64"):
        envs.reset(options={"image": [None, _frame((64, 64))]})
    assert counts(world.model) == (0, 0, 0)  # refused before any session opened
    envs.close()


def test_auto_tier_and_the_drawn_scene_use_the_model_size_as_reference(world):  # noqa: F811
    env = worldstep.make_env(world, embodiment="pusht", resolution_tier="auto")
    obs, info = env.reset(seed=0)  # a 32x32 drawn scene: tier 256, never enlarged, padded by replication
    assert info["resolution_tier"] == 256 and obs["frames"].shape == (4, 32, 32, 3)
    assert env.unwrapped.episode.session.frame.caption_size == (256, 256)
    env.close()
    with pytest.raises(ValueError, match=r"env.resolution_tier = 300: must be one of 256, 480, 704, 720 or 'auto'"):
        worldstep.make_env(world, resolution_tier=300)
    with pytest.raises(ValueError, match=r"tier=300 is invalid; allowed: one of \[256, 480, 704, 720\]"):
        WorldModelEnv(world.model, world.knobs, embodiment=8, resolution_tier=300)
    with pytest.raises(ValueError, match=r"tier='big' is invalid; allowed: 256, 480, 704, 720, 'auto' or None"):
        WorldModelEnv(world.model, world.knobs, embodiment=8, resolution_tier="big")


def test_the_rollout_command_takes_an_embodiment(world, tmp_path):  # noqa: F811
    import json

    import av
    from worldstep.cli import main

    out = tmp_path / "droid.mp4"
    assert main(["rollout", "--env", "worldstep/Tiny-v0", "--embodiment", "droid_lerobot", "--policy", "random",
                 "--windows", "1", "--out", str(out), "--quiet", "--set", "height=32", "--set", "width=32",
                 "--set", "num_steps=1"]) == 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert (summary["embodiment"], summary["domain_id"]) == ("droid_lerobot", 8)  # the embodiment's id
    with av.open(str(out)) as container:
        assert container.streams.video[0].average_rate == 15  # the video plays at DROID's 15 fps


def test_the_memory_plan_counts_the_canvas_grid(world):  # noqa: F811
    from worldstep.memory import plan_for_world

    big = worldstep.load(world, height=512, width=512)  # a 512x512 first frame shrinks into the 256 tier's canvas
    plain = plan_for_world(big, windows=4)
    canvas = plan_for_world(worldstep.load(big, embodiment="pusht", resolution_tier=256), windows=4)
    assert plain.tokens_per_frame == 16 * 16 and canvas.tokens_per_frame == 8 * 8  # 512 / 16 / 2, then 256 / 16 / 2
    assert counts(big.model) == (0, 0, 0)
