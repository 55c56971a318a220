"""``observation="latents"``: the window's latents, no decoder call per step, and ``render()`` that decodes on demand
into exactly the frames env's frame; in the env, ``gym.make``, configs, wrappers, the vector env and serve."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
import worldstep
from gymnasium.utils.env_checker import check_env
from tiny_world import FAST, assert_frames_match_batched, cache_dir, ramp, world, zeros  # noqa: F401 - fixtures
from worldstep.engine.settings import ConfigError
from worldstep.envs import RecordRollout, WorldModelVectorEnv, fork_env

TOKEN = "t0ken-for-latents"


def counts(model) -> tuple[int, int, int]:
    return model.kv.num_used_pages, model.decoder.live_warm_sessions, model.live_sessions


@pytest.fixture
def decoder_calls(world, monkeypatch):  # noqa: F811
    """Counts calls into the VAE decoder: every decode of the warm decoder (one entry point), and every module call
    of the decoder network it runs (so work done around that entry point would show too)."""
    decoder = world.model.decoder
    calls = {"decodes": 0, "modules": 0}
    entry = decoder._decode_locked

    def counted(*args, **kwargs):
        calls["decodes"] += 1
        return entry(*args, **kwargs)

    monkeypatch.setattr(decoder, "_decode_locked", counted)

    def hook(module, args):
        calls["modules"] += 1

    handles = [m.register_forward_pre_hook(hook) for m in decoder._decoder.modules()]
    yield calls
    for h in handles:
        h.remove()


def pair(world, **kwargs):  # noqa: F811
    """A frames env and a latent env of the same world and keywords."""
    frames = worldstep.make_env(world, render_mode="rgb_array", **kwargs)
    latents = worldstep.make_env(world, render_mode="rgb_array", observation="latents", **kwargs)
    return frames, latents


# --- spaces, checker, configs ----------------------------------------------------------------------------------


def test_latent_env_passes_check_env_and_its_space_is_the_windows_latents(world):  # noqa: F811
    env = gym.make("worldstep/Tiny-v0", model=world, observation="latents", max_windows=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    spec, knobs = world.spec, world.knobs
    box = env.observation_space["latents"]
    assert set(env.observation_space.spaces) == {"latents"}
    assert box.shape == (knobs.latents_per_window, spec.latent_channels, spec.latent_height, spec.latent_width)
    assert box.dtype == np.float32
    obs, _ = env.reset(seed=0)
    assert obs in env.observation_space
    first = env.unwrapped.episode.session.first_latent  # reset: frame 0's latent, repeated
    assert np.array_equal(obs["latents"][0], first[:, 0].numpy())
    obs, *_ = env.step(env.action_space.sample())
    assert obs in env.observation_space and np.isfinite(obs["latents"]).all()
    env.close()
    assert counts(world.model) == (0, 0, 0)


def test_frames_stay_the_default_and_the_config_key_selects_latents(world):  # noqa: F811
    assert worldstep.load_config("tiny").env.observation == "frames"
    env = worldstep.make_env(world)
    assert set(env.observation_space.spaces) == {"frames"}
    env.close()
    latent_world = worldstep.load(world, observation="latents")  # an env override: the same model
    assert latent_world.model is world.model and latent_world.config.env.observation == "latents"
    env = worldstep.make_env(latent_world)
    assert set(env.observation_space.spaces) == {"latents"} and env.unwrapped.knobs.decode is False
    env.close()


def test_bad_observation_values_are_refused_naming_the_argument(world):  # noqa: F811
    with pytest.raises(ConfigError, match=r"env.observation = 'pixels'"):
        worldstep.load(world, observation="pixels")
    from worldstep.envs import make_world_model_env

    with pytest.raises(ValueError, match=r"observation='pixels' is invalid; allowed: 'frames', 'latents'"):
        make_world_model_env(world.model, world.knobs, observation="pixels")
    no_decode = world.knobs.model_copy(update={"decode": False})
    with pytest.raises(ValueError, match=r"knobs=.* is invalid; allowed: .*decode=True, or observation='latents'"):
        make_world_model_env(world.model, no_decode)
    env = make_world_model_env(world.model, no_decode, observation="latents", domain_id=8)  # no decode knob needed
    env.close()
    assert counts(world.model) == (0, 0, 0)


# --- no decode per step; render equals the frames env ----------------------------------------------------------


def test_steps_make_no_decoder_call_and_render_decodes_the_skipped_windows(world, decoder_calls):  # noqa: F811
    frames_env, latent_env = pair(world, max_windows=8)
    frames_env.reset(seed=0)
    assert decoder_calls["decodes"] == 1 and decoder_calls["modules"] > 0  # the counter sees a frames env's decode
    frames_env.step(ramp(frames_env.action_space))
    assert decoder_calls["decodes"] == 2
    frames_env.close()
    decoder_calls.update(decodes=0, modules=0)

    latent_env.reset(seed=0)
    for _ in range(3):
        latent_env.step(ramp(latent_env.action_space))
    assert decoder_calls == {"decodes": 0, "modules": 0}
    latent_env.render()  # frame 0 and three windows, in order
    assert decoder_calls["decodes"] == 4 and decoder_calls["modules"] > 0
    latent_env.render()  # nothing new to decode
    assert decoder_calls["decodes"] == 4
    latent_env.close()
    assert counts(world.model) == (0, 0, 0)


def test_render_is_the_frames_envs_frame_at_every_step_whatever_was_skipped(world):  # noqa: F811
    frames_env, latent_env = pair(world, max_windows=8)
    frames_env.reset(seed=5)
    latent_env.reset(seed=5)
    assert np.array_equal(latent_env.render(), frames_env.render())
    rng = np.random.default_rng(0)
    looks = {1, 4, 5}  # windows 2 and 3 are skipped: window 4's render catches up over them
    for window in range(1, 6):
        actions = rng.uniform(-1, 1, frames_env.action_space.shape).astype(np.float32)
        frames_obs, *_ = frames_env.step(actions)
        latent_env.step(actions)
        if window in looks:  # the same decode path (one session per call): bit-equal
            frame = latent_env.render()
            assert frame.dtype == np.uint8 and np.array_equal(frame, frames_env.render())
            assert np.array_equal(frame, frames_obs["frames"][-1])
    for env in (frames_env, latent_env):
        env.close()
    assert counts(world.model) == (0, 0, 0)


def test_latents_are_the_windows_the_frames_env_decodes(world):  # noqa: F811
    frames_env, latent_env = pair(world, max_windows=4)
    frames_env.reset(seed=2)
    latent_env.reset(seed=2)
    actions = ramp(frames_env.action_space)
    model = world.model
    session = frames_env.unwrapped.episode.session
    results = []
    step = model.step

    def recorded(sessions, acts, **kwargs):  # the frames env's window, latents included
        out = step(sessions, acts, **kwargs)
        results.extend(out)
        return out

    model.step = recorded
    try:
        frames_env.step(actions)
    finally:
        del model.step
    obs, *_ = latent_env.step(actions)
    assert results[0].frames is not None and session is frames_env.unwrapped.episode.session
    assert np.array_equal(obs["latents"], results[0].latents.permute(1, 0, 2, 3).numpy())
    for env in (frames_env, latent_env):
        env.close()


def test_fork_renders_as_the_frames_envs_fork(world):  # noqa: F811
    frames_env, latent_env = pair(world, max_windows=8)
    for env in (frames_env, latent_env):
        env.reset(seed=1)
        env.step(ramp(env.action_space))
    frames_twin, latent_twin = fork_env(frames_env), fork_env(latent_env)  # the latent one never rendered yet
    for env in (frames_env, latent_env, frames_twin, latent_twin):
        env.step(ramp(env.action_space, 0.9))
    assert np.array_equal(latent_twin.render(), frames_twin.render())
    assert np.array_equal(latent_env.render(), frames_env.render())
    for env in (frames_twin, latent_twin, frames_env, latent_env):
        env.close()
    assert counts(world.model) == (0, 0, 0)


# --- resources --------------------------------------------------------------------------------------------------


def test_every_page_and_decoder_session_comes_back_on_close_and_reset(world):  # noqa: F811
    decoder = world.model.decoder
    opened, closed = [], []
    open_session, close_session = decoder.open_session, decoder.close_session
    decoder.open_session = lambda: opened.append(open_session()) or opened[-1]
    decoder.close_session = lambda s: closed.append(s) or close_session(s)
    try:
        env = worldstep.make_env(world, observation="latents", render_mode="rgb_array", max_windows=8)
        env.reset(seed=0)
        env.step(zeros(env.action_space))
        env.render()  # takes a warm slot
        assert counts(world.model)[1:] == (1, 1)
        env.reset(seed=1)  # the old episode's decoder session goes back
        assert counts(world.model)[1:] == (0, 1) and closed == opened[:1]
        env.step(zeros(env.action_space))  # never rendered: no slot taken, still closed on close
        env.close()
    finally:
        del decoder.open_session, decoder.close_session
    assert counts(world.model) == (0, 0, 0)
    assert len(opened) == 2 and {id(s) for s in closed} == {id(s) for s in opened}
    assert all(s.closed for s in opened)


def test_a_truncation_by_the_pool_keeps_the_frames_viewable_until_reset(world):  # noqa: F811
    pages = world.model.min_pages(world.config.env.prompt, world.knobs)
    small = worldstep.load(world.config, num_pages=pages, context_frames=0)
    reference = worldstep.load(world.config, context_frames=0)  # a pool that never runs out
    env = worldstep.make_env(small, max_windows=50, observation="latents", render_mode="rgb_array")
    ref = worldstep.make_env(reference, max_windows=50, render_mode="rgb_array")
    env.reset(seed=0)
    ref.reset(seed=0)
    for _ in range(50):
        obs, reward, terminated, truncated, info = env.step(zeros(env.action_space))
        if truncated:
            break
        ref.step(zeros(ref.action_space))
    assert truncated and info["kv_exhausted"] and obs in env.observation_space
    assert small.model.kv.num_used_pages == 0 and small.model.live_sessions == 0  # the engine session is gone
    assert np.array_equal(env.render(), ref.render())  # the last window before the pool ran out
    assert small.model.decoder.live_warm_sessions == 1
    env.reset(seed=0)
    assert small.model.decoder.live_warm_sessions == 0
    env.close()
    ref.close()
    assert counts(small.model) == (0, 0, 0)


# --- wrappers ---------------------------------------------------------------------------------------------------


def test_wrappers_judge_latents_and_refuse_pixel_judges(world):  # noqa: F811
    seen = []

    def success(latents):
        seen.append(latents.shape)
        return True

    env = worldstep.make_env(world, observation="latents", success_fn=success, max_windows=4)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(zeros(env.action_space))
    assert terminated and reward == 1.0 and info["is_success"]
    assert seen == [env.observation_space["latents"].shape]
    env.close()
    sim = worldstep.load(world, simulator="worldstep/PushSim-v0")
    with pytest.raises(ValueError, match=r"success_fn='sim' is invalid with observation='latents'"):
        worldstep.make_env(sim, observation="latents", success_fn="sim")
    env = worldstep.make_env(sim, observation="latents")  # the default judge is "none" without pixels
    assert not env.get_wrapper_attr("judges")
    env.close()
    with pytest.raises(TypeError, match="uint8 'frames'"):  # a wrapper that needs frames says so
        RecordRollout(worldstep.make_env(world, observation="latents"), "unused")
    wrapped = gym.wrappers.RecordEpisodeStatistics(gym.make("worldstep/Tiny-v0", model=world, observation="latents",
                                                            max_episode_steps=2))
    wrapped.reset(seed=0)
    for _ in range(2):
        _, _, terminated, truncated, info = wrapped.step(wrapped.action_space.sample())
    assert truncated and info["episode"]["l"] == 2
    wrapped.close()
    assert counts(world.model) == (0, 0, 0)


# --- the vector env ----------------------------------------------------------------------------------------------


def test_vector_env_steps_latents_in_one_call_without_decoding_and_renders_each(world, decoder_calls):  # noqa: F811
    n = 3
    frames_vec = WorldModelVectorEnv(world.model, n, world.knobs, max_windows=8, render_mode="rgb_array", domain_id=8)
    latent_vec = WorldModelVectorEnv(world.model, n, world.knobs, max_windows=8, render_mode="rgb_array", domain_id=8,
                                     observation="latents")
    assert latent_vec.single_observation_space == latent_vec.envs[0].observation_space
    obs, _ = latent_vec.reset(seed=0)
    assert obs in latent_vec.observation_space and obs["latents"].shape[0] == n
    frames_vec.reset(seed=0)
    calls = []
    step = world.model.step

    def counted(sessions, actions, **kwargs):
        calls.append(len(sessions))
        return step(sessions, actions, **kwargs)

    world.model.step = counted
    decoder_calls.update(decodes=0, modules=0)
    try:
        actions = np.stack([ramp(latent_vec.single_action_space, 0.2 * (i + 1)) for i in range(n)])
        for _ in range(2):
            obs, *_ = latent_vec.step(actions)
        assert calls == [n, n] and decoder_calls == {"decodes": 0, "modules": 0}
        assert obs in latent_vec.observation_space
        for _ in range(2):
            frames_vec.step(actions)
    finally:
        del world.model.step
    for got, want in zip(latent_vec.render(), frames_vec.render()):  # tiny decodes each session alone: bit-equal
        assert np.array_equal(got, want)
    masked, _ = latent_vec.reset(options={"reset_mask": np.array([True, False, False])})
    assert masked in latent_vec.observation_space
    for vec in (frames_vec, latent_vec):
        vec.close()
    assert counts(world.model) == (0, 0, 0)


def test_vector_env_render_within_the_stacked_decode_bound(world):  # noqa: F811
    stacked = worldstep.load(world, batch_sessions=True)  # frames of one stacked decoder call per step
    kwargs = {"max_windows": 4, "render_mode": "rgb_array", "domain_id": 8}
    frames_vec = WorldModelVectorEnv(stacked.model, 2, stacked.knobs, **kwargs)
    latent_vec = WorldModelVectorEnv(stacked.model, 2, stacked.knobs, observation="latents", **kwargs)
    for vec in (frames_vec, latent_vec):
        vec.reset(seed=3)
        for _ in range(2):
            vec.step(np.stack([ramp(vec.single_action_space, s) for s in (0.3, -0.6)]))
    for got, want in zip(latent_vec.render(), frames_vec.render()):  # rendered alone vs stacked
        assert_frames_match_batched(got[None], want[None])
    for vec in (frames_vec, latent_vec):
        vec.close()
    assert counts(stacked.model) == (0, 0, 0)


def test_latent_engine_sessions_decode_nothing_beside_frames_sessions_in_one_step(world):  # noqa: F811
    from worldstep.envs.batched import step_batch

    frames_env, latent_env = pair(world, max_windows=4)
    alone_f, alone_l = pair(world, max_windows=4)
    for env in (frames_env, latent_env, alone_f, alone_l):
        env.reset(seed=4)
    actions = ramp(frames_env.action_space)
    (obs_f, *_), (obs_l, *_) = step_batch([frames_env, latent_env], [actions, actions])  # one engine call
    assert set(obs_f) == {"frames"} and set(obs_l) == {"latents"}
    assert_frames_match_batched(obs_f["frames"], alone_f.step(actions)[0]["frames"])
    assert np.allclose(obs_l["latents"], alone_l.step(actions)[0]["latents"], atol=1e-5)
    assert_frames_match_batched(latent_env.render()[None], frames_env.render()[None])
    for env in (frames_env, latent_env, alone_f, alone_l):
        env.close()
    assert counts(world.model) == (0, 0, 0)


# --- serve ---------------------------------------------------------------------------------------------------------


def test_remote_latent_env_equals_the_local_one_and_renders_on_the_server(world):  # noqa: F811
    from worldstep.serve import RemoteWorldModelEnv
    from worldstep.serve.server import WorldModelServer

    server = WorldModelServer(world, token=TOKEN).start()
    try:
        remote = gym.make("worldstep/Remote-v0", url=server.url, token=TOKEN, observation="latents",
                          render_mode="rgb_array", max_windows=4)
        assert isinstance(remote.unwrapped, RemoteWorldModelEnv)
        local, frames_env = (worldstep.make_env(world, max_windows=4, render_mode="rgb_array", observation=o)
                             for o in ("latents", "frames"))
        assert remote.observation_space == local.observation_space
        for env in (remote, local, frames_env):
            env.reset(seed=7)
        assert np.array_equal(remote.render(), frames_env.render())
        for _ in range(2):
            actions = ramp(local.action_space, 0.4)
            obs_r, *_ = remote.step(actions)
            obs_l, *_ = local.step(actions)
            frames_env.step(actions)
            assert set(obs_r) == {"latents"} and np.array_equal(obs_r["latents"], obs_l["latents"])
        assert np.array_equal(remote.render(), frames_env.render())
        remote.close()
        with pytest.raises(gym.error.ClosedEnvironmentError):
            remote.unwrapped.render()
        for env in (local, frames_env):
            env.close()
    finally:
        server.drain()
    assert server.open_sessions() == 0 and server.pages_in_use() == 0
    assert counts(world.model) == (0, 0, 0)


def test_the_frames_of_a_latent_episode_are_what_torch_decodes(world):  # noqa: F811
    """The render path goes through the model's decoder, not a copy of frames kept from elsewhere: frame 0 is the
    decoder's decode of the reset latent."""
    env = worldstep.make_env(world, observation="latents", render_mode="rgb_array")
    obs, _ = env.reset(seed=0)
    decoder = world.model.decoder
    with decoder.session() as s:
        want = decoder.decode(s, torch.from_numpy(obs["latents"][:1]).permute(1, 0, 2, 3))
    assert np.array_equal(env.render(), want[-1])
    env.close()


def test_evaluate_refuses_a_latent_env_or_world_before_any_episode(world, tmp_path):  # noqa: F811
    """Evaluation reads each window's frames (videos, frame counts, pixel judges): a latent env, vector env or world
    is refused at once, naming the fix, instead of failing every episode on a missing key."""
    latent_world = worldstep.load(world, observation="latents")
    env = worldstep.make_env(world, observation="latents", max_windows=2)
    try:
        for target in (latent_world, env):
            with pytest.raises(ValueError, match="observation='latents' is invalid for evaluate"):
                worldstep.evaluate(target, lambda obs: np.zeros((4, 2), np.float32), 1, out_dir=tmp_path / "r")
    finally:
        env.close()
    assert not (tmp_path / "r").exists()  # refused before any work
