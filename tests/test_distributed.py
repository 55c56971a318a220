"""Ray-sharded evaluation on a local two-CPU Ray cluster: equal to the local backend, re-runs after actor deaths.

The Ray tests skip only when ray is not importable; ``make test`` installs the ``dist`` extra so CI runs them.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import worldstep
from tiny_world import FAST, cache_dir, world  # noqa: F401 - fixtures
from worldstep.evaluation.distributed import RayUnavailableError, WorkerStartError, evaluate_ray
from worldstep.evaluation.distributed.ray_eval import torch_threads
from worldstep.policies import RandomPolicy, SinePolicy

TIMING_KEYS = ("wall_s", "frames_per_second", "video")


def comparable(report) -> list[dict]:
    return [{k: v for k, v in vars(e).items() if k not in TIMING_KEYS} for e in report.episodes]


def test_ray_backend_without_ray_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(RayUnavailableError, match=r"pip install 'worldstep\[dist\]'"):
        worldstep.evaluate("tiny", SinePolicy((4, 10)), 1, out_dir=tmp_path, backend="ray")


def test_backend_arguments_are_checked(world, tmp_path):  # noqa: F811
    policy = SinePolicy(world.action_shape)
    with pytest.raises(ValueError, match="backend='spark' is invalid; allowed: 'local' or 'ray'"):
        worldstep.evaluate(world, policy, 1, out_dir=tmp_path, backend="spark")
    with pytest.raises(ValueError, match="only apply with backend='ray'"):
        worldstep.evaluate(world, policy, 1, out_dir=tmp_path, num_workers=2)


# --- with a local Ray cluster ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster(cache_dir):  # noqa: F811 - the actors inherit its WORLDSTEP_CACHE
    import ray  # the dist extra installs it

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        mp.delenv("RAY_ADDRESS", raising=False)
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024**2, log_to_driver=False)
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # test policies travel by value
        try:
            yield ray
        finally:
            ray.shutdown()


class StallOncePolicy(SinePolicy):
    """A sine policy that, in the episode with ``seed``, writes its actor's name to ``marker`` and waits
    (bounded) to be killed, the first time only; the re-run finds the marker and goes on."""

    def __init__(self, action_space, marker: str, seed: int) -> None:
        super().__init__(action_space)
        self.marker, self.target, self.seed = marker, seed, None

    def reset(self, seed=None) -> None:
        super().reset(seed)
        self.seed = seed

    def __call__(self, obs):
        if self.seed == self.target and not os.path.exists(self.marker):
            import ray

            Path(self.marker).write_text(ray.get_runtime_context().get_actor_name())
            time.sleep(120)  # killed long before
        return super().__call__(obs)


class DiesPolicy(SinePolicy):
    """A sine policy whose process exits in the episode with ``seed``: its actor dies every time."""

    def __init__(self, action_space, seed: int) -> None:
        super().__init__(action_space)
        self.target = seed

    def reset(self, seed=None) -> None:
        super().reset(seed)
        if seed == self.target:
            os._exit(1)


def test_ray_matches_local_episode_by_episode(ray_cluster, world, tmp_path):  # noqa: F811
    episodes = [{"seed": 3, "max_windows": 2}, {"seed": 5, "max_windows": 1, "prompt": "pick up the red cube"},
                {"seed": 8, "max_windows": 2, "domain_id": 8}]
    kwargs = dict(success_fn=lambda frames: frames.mean() > 120, progress=False)
    # The same calls at the same thread count as the actors (a 0.5-CPU share runs 1 torch thread), on the
    # same machine: byte-identical frames by construction (docs/exactness.md).
    assert torch_threads(0.5) == 1
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        local = worldstep.evaluate(world, RandomPolicy(world.action_shape, seed=1), episodes,
                                   out_dir=tmp_path / "l", **kwargs)
    finally:
        torch.set_num_threads(threads)
    remote = worldstep.evaluate(world, RandomPolicy(world.action_shape, seed=1), episodes, out_dir=tmp_path / "r",
                                backend="ray", num_workers=2, **kwargs)
    assert comparable(remote) == comparable(local) and all(e.status == "ok" for e in remote.episodes)
    for a, b in zip(local.episodes, remote.episodes):  # the same frames: byte-identical videos
        assert Path(b.video) == tmp_path / "r" / Path(a.video).name
        assert Path(a.video).read_bytes() == Path(b.video).read_bytes()
    local_json = json.loads((tmp_path / "l" / "report.json").read_text())
    remote_json = json.loads((tmp_path / "r" / "report.json").read_text())
    assert set(local_json) == set(remote_json)
    assert [set(e) for e in local_json["episodes"]] == [set(e) for e in remote_json["episodes"]]

    batched = worldstep.evaluation.distributed.evaluate_ray(world, RandomPolicy(world.action_shape, seed=1), episodes,
                                                 out_dir=tmp_path / "b", batched=True, batch_size=2,
                                                 record_video=False, timeout_s=300, **kwargs)
    assert comparable(batched) == comparable(local) and batched.batched


def test_killed_actor_has_its_episode_rerun_elsewhere(ray_cluster, world, tmp_path):  # noqa: F811
    episodes = [{"seed": s, "max_windows": 2} for s in (0, 1, 2, 3)]
    marker = tmp_path / "stalled-in"
    policy = StallOncePolicy(world.action_shape, str(marker), seed=2)
    out: dict = {}

    def run() -> None:
        try:
            out["report"] = evaluate_ray(world, policy, episodes, out_dir=tmp_path / "r", num_workers=2,
                                         record_video=False, progress=False, timeout_s=300)
        except BaseException as err:  # surfaced below
            out["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 240
    while not marker.exists() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.exists(), out.get("error")
    ray_cluster.kill(ray_cluster.get_actor(marker.read_text()))  # mid-episode
    thread.join(timeout=300)
    assert not thread.is_alive() and "error" not in out, out.get("error")
    local = worldstep.evaluate(world, SinePolicy(world.action_shape), episodes, out_dir=tmp_path / "l",
                               record_video=False, progress=False)
    assert comparable(out["report"]) == comparable(local)
    assert [e.status for e in out["report"].episodes] == ["ok"] * 4


def test_episodes_of_an_actor_that_keeps_dying_are_marked_failed(ray_cluster, world, tmp_path):  # noqa: F811
    episodes = [{"seed": s, "max_windows": 1} for s in (0, 1, 2)]
    report = worldstep.evaluation.distributed.evaluate_ray(world, DiesPolicy(world.action_shape, seed=1), episodes,
                                                out_dir=tmp_path, num_workers=2, max_retries=1,
                                                record_video=False, progress=False, timeout_s=300)
    assert [e.status for e in report.episodes] == ["ok", "failed", "ok"]
    failed = report.episodes[1]
    assert failed.seed == 1 and failed.windows == 0 and "2 Ray workers died" in failed.error
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["num_episodes"] == 3 and data["num_failed"] == 1 and data["episodes"][1]["status"] == "failed"
    from ray.util import list_named_actors

    deadline = time.monotonic() + 30  # every actor is killed at the end (each holds a model)
    while [a for a in list_named_actors() if a.startswith("worldstep-eval-")] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [a for a in list_named_actors() if a.startswith("worldstep-eval-")]


def test_remote_policy_travels_to_the_actors(ray_cluster, world, tmp_path):  # noqa: F811
    from worldstep.policies.remote import RemotePolicy
    from worldstep.policies.server import PolicyServer, demo_policy

    episodes = [{"seed": s, "max_windows": 2} for s in (0, 1)]
    with PolicyServer(demo_policy(*world.action_shape, horizon=6), lifetime_s=240) as server:
        policy = RemotePolicy(server.endpoint, world.action_shape, prompt="p", action_mode="rechunk")
        local = worldstep.evaluate(world, policy, episodes, out_dir=tmp_path / "l", record_video=False,
                                   progress=False)
        policy.close()
        remote = worldstep.evaluation.distributed.evaluate_ray(world, policy, episodes, out_dir=tmp_path / "r",
                                                    record_video=False, progress=False, timeout_s=300)
    assert comparable(remote) == comparable(local) and all(e.status == "ok" for e in remote.episodes)


def test_a_model_no_actor_can_load_fails_fast_with_the_actors_error(ray_cluster, world, tmp_path,  # noqa: F811
                                                                      monkeypatch):
    from worldstep.evaluation.distributed import ray_eval

    queues = []

    class Recorded(ray_eval.ShardQueue):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            queues.append(self)

    monkeypatch.setattr(ray_eval, "ShardQueue", Recorded)
    missing = tmp_path / "no-such-checkpoint"
    config = world.config.with_overrides(model={"name": "missing", "checkpoint": str(missing), "architecture": None})
    with pytest.raises(WorkerStartError, match=rf"could not load the model: .*{missing.name}"):
        worldstep.evaluation.distributed.evaluate_ray(config, SinePolicy((4, 10)), 4, out_dir=tmp_path, progress=False,
                                           timeout_s=300)
    # Counted, not timed: the first failed start ends the run, no replacement actors (not 4 shards x 3 attempts).
    (shard_queue,) = queues
    assert shard_queue.started <= shard_queue.num_workers and shard_queue.finished == 0


def test_ray_evaluate_rejects_envs_and_bad_counts(ray_cluster, world, tmp_path):  # noqa: F811
    policy = SinePolicy(world.action_shape)
    with pytest.raises(ValueError, match="not an env"):
        worldstep.evaluate(worldstep.make_env(world), policy, 1, out_dir=tmp_path, backend="ray")
    with pytest.raises(ValueError, match="num_workers=0 is invalid"):
        worldstep.evaluate(world, policy, 1, out_dir=tmp_path, backend="ray", num_workers=0)


def test_actor_resources_fit_the_cluster():
    from worldstep.evaluation.distributed.ray_eval import _actor_options

    assert _actor_options({"CPU": 2.0}, 2, None) == ({"num_cpus": 0.5}, 2)
    assert _actor_options({"CPU": 2.0}, 8, None) == ({"num_cpus": 0.25}, 8)  # never more than the cluster has
    with pytest.warns(UserWarning, match="2 GPUs: starting 2 workers"):
        assert _actor_options({"CPU": 16.0, "GPU": 2.0}, 4, None) == ({"num_gpus": 1, "num_cpus": 1.0}, 2)


def test_shards_stream_per_episode_unless_batched():
    from worldstep.episodes import EpisodeConfig
    from worldstep.evaluation.distributed.ray_eval import _shards

    eps = [EpisodeConfig(seed=i) for i in range(5)]
    assert [s.indices for s in _shards(eps, False, None, 2)] == [[0], [1], [2], [3], [4]]
    assert [s.indices for s in _shards(eps, True, None, 2)] == [[0, 1, 2], [3, 4]]
    assert [s.indices for s in _shards(eps, True, 2, 2)] == [[0, 1], [2, 3], [4]]
    assert np.array_equal(sum(([e.seed for e in s.episodes] for s in _shards(eps, True, 2, 2)), []), range(5))


def test_cli_eval_without_ray_names_the_extra(monkeypatch, tmp_path, capsys):
    from worldstep.cli import main

    (tmp_path / "eps.yaml").write_text("- {seed: 0, max_windows: 1}\n")
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main(["eval", str(tmp_path / "eps.yaml"), "--ray", "--out-dir", str(tmp_path)]) == 2
    assert "pip install 'worldstep[dist]'" in capsys.readouterr().err


def test_cli_eval_ray_writes_the_local_report(ray_cluster, tmp_path, capsys):
    from worldstep.cli import main

    (tmp_path / "eps.yaml").write_text("- {seed: 0, max_windows: 1}\n- {seed: 1, max_windows: 2}\n")
    flags = ["--device", "cpu", "--set", "height=32", "--set", "width=32", "--set", "num_steps=1", "--quiet"]
    assert main(["eval", str(tmp_path / "eps.yaml"), "--ray", "--workers", "2", "--out-dir", str(tmp_path / "r"),
                 *flags]) == 0
    assert main(["eval", str(tmp_path / "eps.yaml"), "--out-dir", str(tmp_path / "l"), *flags]) == 0
    remote, local = (json.loads((tmp_path / d / "report.json").read_text()) for d in ("r", "l"))
    strip = [{k: v for k, v in e.items() if k not in TIMING_KEYS} for e in local["episodes"]]
    assert [{k: v for k, v in e.items() if k not in TIMING_KEYS} for e in remote["episodes"]] == strip
    assert remote["num_failed"] == 0 and len(list((tmp_path / "r").glob("episode-*.mp4"))) == 2
    assert "2 episodes" in capsys.readouterr().out


def test_ctrl_c_writes_the_interrupted_report_and_frees_the_actors(ray_cluster, world, tmp_path,  # noqa: F811
                                                                  monkeypatch):
    """Ctrl-C after the first episode came back: report.json holds it with status "interrupted" (as the
    local backend writes), KeyboardInterrupt propagates, and no actor is left holding a model."""
    from ray.util import list_named_actors
    from worldstep.evaluation.distributed import ray_eval

    class InterruptedAfterOne(ray_eval.ShardQueue):
        def run(self, shards, on_done, on_failed, timeout_s=None):
            def done_then_interrupt(output):
                on_done(output)
                raise KeyboardInterrupt

            super().run(shards, done_then_interrupt, on_failed, timeout_s)

    monkeypatch.setattr(ray_eval, "ShardQueue", InterruptedAfterOne)
    episodes = [{"seed": s, "max_windows": 1} for s in (0, 1, 2)]
    with pytest.raises(KeyboardInterrupt):
        worldstep.evaluation.distributed.evaluate_ray(world, SinePolicy(world.action_shape), episodes, out_dir=tmp_path,
                                           num_workers=1, record_video=False, progress=False, timeout_s=300)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "interrupted" and len(report["episodes"]) == 1
    assert report["episodes"][0]["status"] == "ok" and report["episodes"][0]["windows"] == 1
    assert not [a for a in list_named_actors() if a.startswith("worldstep-eval-")]
