"""load/make_env, evaluate (sequential and batched), report.json schema, videos and the memory plan."""

from __future__ import annotations

import json

import av
import numpy as np
import pytest
import worldstep
from tiny_world import FAST, cache_dir, world, zeros  # noqa: F401 - fixtures
from worldstep.episodes import EpisodeConfig
from worldstep.memory import plan, plan_for_world
from worldstep.policies import RandomPolicy, SinePolicy

EPISODE_KEYS = {"index", "seed", "windows", "frames", "episode_return", "success", "terminated", "truncated",
                "wall_s", "frames_per_second", "video"}


def test_load_shares_only_when_asked_and_rollout_overrides_of_a_world_do_not_reload(world):  # noqa: F811
    again = worldstep.load(world, num_steps=2, max_windows=3)  # a World passed around: its model, new knobs
    assert again.model is world.model and again.config.rollout.num_steps == 2
    assert again.knobs.num_steps == 2 and again.action_shape == (4, 10)
    fresh = worldstep.load("tiny", device="cpu", **FAST)  # no hidden cache: a fresh model and page pool
    assert fresh.model is not world.model
    shared = [worldstep.load("tiny", device="cpu", share=True, **FAST) for _ in range(2)]
    assert shared[0].model is shared[1].model is not fresh.model
    other = worldstep.load(world, num_pages=64)  # a cache override needs another model
    assert other.model is not world.model and other.model.kv.allocator.num_pages == 64
    with pytest.raises(ValueError, match="share=1 is invalid"):
        worldstep.load("tiny", share=1)


def test_make_env_takes_config_keys_and_env_arguments(world):  # noqa: F811
    image = np.full((32, 32, 3), 90, np.uint8)
    env = worldstep.make_env(world, max_windows=2, prompt="pick up the red cube", domain_id=4, action_width=2,
                             image=image, render_mode="rgb_array")  # domain 4: pusht, 2-wide actions
    inner = env.unwrapped
    assert (env.get_wrapper_attr("max_windows"), inner.prompt, inner.domain_id, inner.embodiment,
            env.action_space.shape) == (2, "pick up the red cube", 4, "pusht", (4, 2))
    with pytest.raises(worldstep.ConfigError, match="env.max_windows = 0"):
        worldstep.make_env(world, max_windows=0)


def test_evaluate_writes_report_and_videos(world, tmp_path):  # noqa: F811
    episodes = [{"seed": 4, "max_windows": 2}, EpisodeConfig(prompt="pick up the red cube", max_windows=1)]
    report = worldstep.evaluate(world, SinePolicy(world.action_shape), episodes, out_dir=tmp_path, seed=7,
                                success_fn=lambda frames: False, progress=False)
    data = json.loads((tmp_path / "report.json").read_text())
    assert {"model", "policy", "batched", "num_episodes", "success_rate", "mean_return", "mean_windows",
            "total_frames", "total_wall_s", "episodes"} <= set(data)
    assert data["num_episodes"] == 2 and data["success_rate"] == 0.0 and data["policy"] == "SinePolicy"
    assert all(set(e) >= EPISODE_KEYS for e in data["episodes"])
    assert [e["seed"] for e in data["episodes"]] == [4, 8]  # an episode without a seed gets seed + index
    assert [e["windows"] for e in data["episodes"]] == [2, 1]
    for e in data["episodes"]:
        with av.open(e["video"]) as container:
            assert sum(1 for _ in container.decode(video=0)) == 1 + 4 * e["windows"]
    assert report.mean_return == 0.0 and world.model.kv.num_used_pages == 0


def test_batched_evaluate_matches_sequential(world, tmp_path):  # noqa: F811
    episodes = [{"seed": 1, "max_windows": 2}, {"seed": 2, "max_windows": 1}, {"seed": 3, "max_windows": 1}]
    kwargs = dict(success_fn=lambda frames: frames.mean() > 127.5, progress=False, record_video=False)
    seq = worldstep.evaluate(world, RandomPolicy(world.action_shape, seed=0), episodes, out_dir=tmp_path / "s",
                             **kwargs)
    bat = worldstep.evaluate(world, RandomPolicy(world.action_shape, seed=0), episodes, out_dir=tmp_path / "b",
                             batched=True, batch_size=2, **kwargs)
    strip = [{k: v for k, v in vars(e).items() if k not in ("wall_s", "frames_per_second")} for e in seq.episodes]
    assert strip == [{k: v for k, v in vars(e).items() if k not in ("wall_s", "frames_per_second")}
                     for e in bat.episodes]
    assert bat.batched and world.model.kv.num_used_pages == 0


def test_evaluate_rejects_bad_episodes_and_argument_mixes(world, tmp_path):  # noqa: F811
    policy = SinePolicy(world.action_shape)
    with pytest.raises(worldstep.ConfigError, match=r"episodes\[1\]\.max_windows = 0"):
        worldstep.evaluate(world, policy, [{}, {"max_windows": 0}], out_dir=tmp_path)
    with pytest.raises(worldstep.ConfigError, match=r"episodes\[0\]\.sead: unknown key"):
        worldstep.evaluate(world, policy, [{"sead": 1}], out_dir=tmp_path)
    env = worldstep.make_env(world)
    with pytest.raises(ValueError, match="success_fn"):
        worldstep.evaluate(env, policy, 1, success_fn=bool, out_dir=tmp_path)
    with pytest.raises(ValueError, match="batched"):
        worldstep.evaluate(env, policy, 1, batched=True, out_dir=tmp_path)


def test_memory_plan_bounds_the_pages_an_episode_holds(world):  # noqa: F811
    for context, page_size in ((1, 4), (0, 16)):  # small pages so the context horizon releases some
        w = worldstep.load(world.config, context_frames=context, page_size=page_size)
        env = worldstep.make_env(w)
        env.reset(seed=0)
        infos = [env.step(zeros(env.action_space))[4]["kv"] for _ in range(4)]
        env.close()
        held = [kv.pages_in_use for kv in infos]
        assert (infos[-1].released_tokens > 0) == (context > 0)
        memory = plan_for_world(w, windows=4)
        assert max(held) <= memory.peak_pages_per_episode <= max(held) + 1
    arch_only = plan(world.config, windows=4, text_tokens=memory.text_tokens)
    assert arch_only.tokens_per_frame == world.spec.tokens_per_frame
    assert arch_only.page_bytes == arch_only.kv_bytes_per_token * 16
