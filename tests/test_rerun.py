"""RerunLogger: a rollout logged to a recording reads back, through Rerun's own dataframe API, as the rollout."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import rerun as rr
import worldstep
from rerun_tables import decoded, read_recording, scalars, series
from worldstep.measures.frames import psnr
from worldstep.view.loggers import RerunLogger, RerunVectorLogger
from worldstep.view.rerun_log import encode_frame


def recording_to(path) -> rr.RecordingStream:
    recording = rr.RecordingStream("worldstep-test")
    recording.save(path)
    return recording


def finish(recording: rr.RecordingStream) -> None:
    recording.flush()
    recording.disconnect()


@pytest.fixture(scope="module")
def pusher_run(tmp_path_factory):
    """Three windows of the pusher model with its simulator beside it, logged losslessly."""
    path = tmp_path_factory.mktemp("rerun") / "pusher.rrd"
    recording = recording_to(path)
    rng = np.random.default_rng(0)
    env = RerunLogger(gym.make("worldstep/Pusher-v0"), recording, truth=gym.make("worldstep/PushSim-v0"),
                      image_format="png")
    obs, info = env.reset(seed=3)
    frames, actions, infos = [obs["frames"][0]], [], []
    for _ in range(3):
        action = rng.uniform(-1, 1, env.action_space.shape).astype(np.float32)
        obs, reward, terminated, truncated, info = env.step(action)
        frames.extend(obs["frames"])
        actions.append(action)
        infos.append((reward, info))
    env.close()
    finish(recording)
    return read_recording(path), np.stack(frames), np.concatenate(actions), infos, info


def test_every_frame_and_the_timeline_read_back_as_the_rollouts(pusher_run):
    table, frames, _, infos, _ = pusher_run
    assert table["frame"] == list(range(len(frames)))  # 1 + 3 windows x 4 frames
    assert table["window"] == [None] + [k for k in range(3) for _ in range(4)]
    assert table["episode"] == [0] * len(frames)
    np.testing.assert_array_equal(decoded(table["/env/frame"]), frames)  # PNG: bit-equal
    pages = scalars(table["/env/kv/pages_in_use"])
    assert pages[0] is not None and [pages[4 * k + 4] for k in range(3)] == [
        info["kv"].pages_in_use for _, info in infos]
    assert scalars(table["/env/reward"])[4::4] == [reward for reward, _ in infos]
    assert scalars(table["/env/success"])[4::4] == [float(info["is_success"]) for _, info in infos]
    assert table["/env/timings:SeriesLines:names"] == ["denoise_s", "commit_s", "decode_s", "other_s", "total_s"]
    timings = series(table["/env/timings"])
    assert table["/env/timings"][4::4] == [list(row) for row in timings] and len(timings) == 3
    for row, (_, info) in zip(timings, infos):
        t = info["timings"]
        assert list(row[:4]) == [t.denoise_s, t.commit_s, t.decode_s, t.other_s]
        assert row[4] == pytest.approx(t.total_s, rel=1e-12)


def test_each_action_dimension_is_a_series_named_from_the_embodiment(pusher_run):
    table, _, actions, _, _ = pusher_run
    column = table["/env/action/pusher"]
    assert column[0] is None  # the first frame has no action
    np.testing.assert_array_equal(series(column), actions.astype(np.float64))  # one row per frame, [dx, dy]
    assert table["/env/action/pusher:SeriesLines:names"] == ["dx", "dy"]


def test_the_simulators_frames_and_psnr_beside_the_models(pusher_run):
    table, frames, actions, infos, _ = pusher_run
    sim = gym.make("worldstep/PushSim-v0")
    obs, _ = sim.reset(seed=3)
    truth = [obs["frames"][0]]
    for k in range(3):
        obs, *_ = sim.step(actions[4 * k:4 * k + 4])
        truth.extend(obs["frames"])
    truth = np.stack(truth)
    np.testing.assert_array_equal(decoded(table["/env/truth/frame"]), truth)
    expected = [float(psnr(frames[1 + 4 * k:5 + 4 * k], truth[1 + 4 * k:5 + 4 * k]).mean()) for k in range(3)]
    assert scalars(table["/env/truth/psnr_db"])[4::4] == expected
    assert [info["truth_psnr_db"] for _, info in infos] == expected


def test_jpeg_frames_are_the_encoders_bytes_and_stay_close(tmp_path):
    path = tmp_path / "tiny.rrd"
    recording = recording_to(path)
    env = RerunLogger(worldstep.make_env("tiny", num_steps=1), recording, jpeg_quality=90)
    obs, _ = env.reset(seed=0)
    frames = [obs["frames"][0]]
    obs, *_ = env.step(env.action_space.sample())
    frames.extend(obs["frames"])
    env.close()
    finish(recording)
    table = read_recording(path)
    assert [bytes(blob[0]) for blob in table["/env/frame"]] == [encode_frame(f, "jpeg", 90) for f in frames]
    # lossy: every decoded frame above 24 dB PSNR against the model's (the random tiny model's noise frames, a
    # hard case for JPEG; measured 26.3..29.2 dB over seeds 0..2)
    assert psnr(decoded(table["/env/frame"]), np.stack(frames)).min() > 24.0
    assert series(table["/env/action/droid_lerobot"]).shape == (4, 10)  # the droid_lerobot embodiment's width
    assert table["/env/action/droid_lerobot:SeriesLines:names"][-1] == "gripper"


def test_a_480p_frame_is_logged_in_a_fraction_of_its_raw_size():
    height, width = 480, 640
    y, x = np.mgrid[0:height, 0:width]
    frame = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], -1).astype(np.uint8)
    assert len(encode_frame(frame, "jpeg", 90)) < frame.nbytes / 20


@pytest.mark.parametrize("mode", ["next_step", "same_step", "disabled"])
def test_the_vector_envs_entities_are_separate(tmp_path, mode):
    path = tmp_path / "vector.rrd"
    recording = recording_to(path)
    envs = RerunLogger(worldstep.world.make_vec_env("tiny", num_envs=2, max_windows=1, num_steps=1,
                                                    autoreset_mode=mode), recording, image_format="png")
    assert isinstance(envs, RerunVectorLogger)
    obs, _ = envs.reset(seed=[0, 5])
    firsts = obs["frames"][:, 0]
    actions = envs.action_space.sample()
    obs, _, _, _, infos = envs.step(actions)  # window 0: both episodes end (max_windows=1)
    if mode == "same_step":  # the ending window is in final_obs; obs already starts episode 1
        window, restarted = np.stack([infos["final_obs"][i]["frames"] for i in range(2)]), obs["frames"][:, 0]
    else:
        window = obs["frames"]
        if mode == "next_step":
            obs, *_ = envs.step(envs.action_space.sample())  # the autoreset step: each starts episode 1
        else:
            obs, _ = envs.reset(options={"reset_mask": np.array([True, True])})
        restarted = obs["frames"][:, 0]
    envs.close()
    finish(recording)
    table = read_recording(path)
    # the frame timeline restarts with each episode: frame 0 now holds episode 1's first frame
    assert table["frame"] == list(range(5)) and table["episode"] == [1, 0, 0, 0, 0]
    for i in range(2):
        logged = decoded(table[f"/env/{i}/frame"])
        np.testing.assert_array_equal(logged, np.concatenate([restarted[i][None], window[i]]))
        assert not np.array_equal(restarted[i], firsts[i])
        np.testing.assert_array_equal(series(table[f"/env/{i}/action/droid_lerobot"]), actions[i].astype(np.float64))
    assert not np.array_equal(window[0], window[1])  # different seeds: a mixed-up entity would show


def test_bad_arguments_are_refused_before_anything_is_logged():
    env = gym.make("worldstep/PushSim-v0")
    with pytest.raises(TypeError, match="env=.*allowed: a gymnasium.Env"):
        RerunLogger("not an env")
    with pytest.raises(TypeError, match="recording=.*rerun.RecordingStream"):
        RerunLogger(env, recording="run.rrd")
    with pytest.raises(ValueError, match="image_format='gif'.*jpeg, png"):
        RerunLogger(env, image_format="gif")
    with pytest.raises(ValueError, match="jpeg_quality=0"):
        RerunLogger(env, jpeg_quality=0)
    with pytest.raises(TypeError, match="truth=.*gymnasium.Env"):
        RerunLogger(env, truth=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'fps'"):
        RerunLogger(env, fps=3)
    with pytest.raises(TypeError, match="observation_space"):
        RerunLogger(gym.make("CartPole-v1"))


# --- the CLI ----------------------------------------------------------------------------------------

FAST = ["--set", "height=32", "--set", "width=32", "--set", "num_steps=1", "--device", "cpu", "--quiet"]


def test_rollout_truth_saves_a_recording_of_both_sides(tmp_path):
    from worldstep.cli import main

    out, rrd = tmp_path / "run.mp4", tmp_path / "run.rrd"
    assert main(["rollout", "--env", "worldstep/Pusher-v0", "--policy", "push", "--windows", "2", "--truth",
                 "--seed", "3", "--out", str(out), "--rerun-save", str(rrd), "--quiet"]) == 0
    summary = json.loads(out.with_suffix(".json").read_text())
    table = read_recording(rrd)
    assert table["frame"] == list(range(9))
    assert len(decoded(table["/env/frame"])) == len(decoded(table["/env/truth/frame"])) == 9
    assert scalars(table["/env/truth/psnr_db"])[4::4] == summary["psnr_db"]  # the summary's own figures


@pytest.mark.parametrize(("flags", "message"), [
    (["rollout", "--rerun-save", "{tmp}/run.txt"], "--rerun-save '{tmp}/run.txt' is invalid; allowed: a path ending "
                                                  "in .rrd"),
    (["rollout", "--rerun-serve", "70000"], "--rerun-serve 70000 is invalid; allowed: a TCP port in 1..65535"),
    (["rollout", "--rerun-save", "{tmp}"], "--rerun-save='{tmp}' is invalid: it is a folder"),
    (["eval", "{tmp}/eps.yaml", "--batched", "--rerun-save", "{tmp}/e.rrd"], "invalid with --ray or --batched"),
    (["eval", "{tmp}/eps.yaml", "--batched", "--rerun-connect", "9876"], "invalid with --ray or --batched"),
    (["rollout", "--rerun-connect", "http://127.0.0.1:9876/proxy"], "--rerun-connect 'http://127.0.0.1:9876/proxy' is "
                                                                     "invalid; allowed: a TCP port (the viewer on "
                                                                     "127.0.0.1) or a URL rerun+http://HOST:PORT/proxy"),
    (["rollout", "--rerun-connect", "rerun+http://127.0.0.1:9876/"], "--rerun-connect 'rerun+http://127.0.0.1:9876/' "
                                                                     "is invalid; allowed: a TCP port"),
    (["rollout", "--rerun-connect", "70000"], "--rerun-connect '70000' is invalid; allowed: a TCP port"),
    (["rollout", "--rerun", "--rerun-connect", "9876"], "--rerun with --rerun-connect '9876' is invalid; allowed: one "
                                                        "of them"),
    (["rollout", "--rerun-connect", "{free}"], "--rerun-connect '{free}' is invalid: nothing answers at "
                                               "rerun+http://127.0.0.1:{free}/proxy; allowed: the URL of a running "
                                               "Rerun viewer or server"),
])
def test_bad_view_flags_are_one_line_errors_before_the_model_loads(flags, message, tmp_path, capsys):
    from worldstep.cli import main

    (tmp_path / "eps.yaml").write_text("- {seed: 1}\n")
    free = free_port()  # nothing listens there
    argv = [f.format(tmp=tmp_path, free=free) for f in flags]
    assert main([*argv, "--out" if argv[0] == "rollout" else "--out-dir", str(tmp_path / "o.mp4"
                 if argv[0] == "rollout" else tmp_path / "out"), *FAST]) == 2
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path, free=free) in err and len(err.strip().splitlines()) == 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_served_web_viewer_answers_over_http_on_loopback(tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "worldstep.cli", "rollout", "--windows", "1", "--out", str(tmp_path / "r.mp4"),
           "--rerun-serve", str(port), *FAST]
    # Ctrl-C ends the serving: the child gets SIGINT's default disposition even where the runner ignores it
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        lines = []
        deadline = time.monotonic() + 300
        while not any(line.startswith("serving the web viewer at") for line in lines):
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"the rollout did not start serving: {lines} {proc.stderr.read()}")
            lines.append(proc.stdout.readline())
        url = next(line.split(": ", 1)[1].strip() for line in lines if line.startswith("watch it live: "))
        assert url == f"http://127.0.0.1:{port}/?url=rerun%2Bhttp%3A%2F%2F127.0.0.1%3A{port + 1}%2Fproxy"
        with urllib.request.urlopen(url, timeout=30) as response:
            body = response.read().decode()
        assert response.status == 200 and "Rerun" in body and "<html" in body.lower()
        proc.send_signal(signal.SIGINT)  # Ctrl-C ends the serving
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_bench_view_times_the_loggers_work_beside_the_step():
    from worldstep.bench.progress import Progress
    from worldstep.bench.settings import ViewSettings
    from worldstep.bench.view import run_view

    result = run_view(ViewSettings(windows=3, warmup=0), Progress("view", quiet=True))
    f = result.results
    assert len(f["step_ms_all"]) == len(f["log_ms_all"]) == 3 and min(f["log_ms_all"]) > 0
    assert f["overhead_pct"] == pytest.approx(100 * f["log_ms"] / f["step_ms"])
    assert f["frames"] == 1 + 3 * 4 and f["raw_bytes_per_frame"] == 64 * 64 * 3
    assert 0 < f["rrd_bytes_per_frame"] < f["raw_bytes_per_frame"]  # encoded frames: well under a raw frame
    with pytest.raises(ValueError, match="--image-format 'gif' is invalid"):
        run_view(ViewSettings(image_format="gif"), Progress("view", quiet=True))


def test_a_failed_run_closes_the_viewers_sinks(tmp_path):
    from worldstep.cli.view import closing_on_error
    from worldstep.view.viewer import open_viewer

    web, stream = free_port(), free_port()
    viewer = open_viewer(save=tmp_path / "failed.rrd", serve=web, grpc_port=stream)
    with socket.socket() as probe, pytest.raises(OSError):
        probe.bind(("127.0.0.1", stream))  # the data stream holds its port while the run lives
    viewer.recording.log("env/reward", rr.Scalars(1.0))
    with pytest.raises(RuntimeError, match="a failing run"), closing_on_error(viewer):
        raise RuntimeError("a failing run")
    deadline = time.monotonic() + 10
    while True:  # the server releases its port shortly after the sink is dropped
        try:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", stream))
            break
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"port {stream} still bound after the failed run closed the viewer")
            time.sleep(0.2)
    assert (tmp_path / "failed.rrd").stat().st_size > 0


def test_eval_logs_episode_after_episode(tmp_path):
    from worldstep.cli import main

    (tmp_path / "eps.yaml").write_text("- {seed: 20000000, max_windows: 1}\n- {seed: 20000001, max_windows: 1}\n")
    rrd = tmp_path / "eval.rrd"
    assert main(["eval", str(tmp_path / "eps.yaml"), "--env", "worldstep/Pusher-v0", "--policy", "push", "--out-dir",
                 str(tmp_path / "out"), "--no-video", "--quiet", "--rerun-save", str(rrd)]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    table = read_recording(rrd)
    assert len(report["episodes"]) == 2 and table["frame"] == list(range(5))
    assert table["episode"] == [1] * 5  # the second episode's frames, at the same frame indices as the first's


def test_plan_logs_the_executed_rollout(tmp_path):
    from worldstep.cli import main

    rrd = tmp_path / "plan.rrd"
    assert main(["plan", "--windows", "1", "--candidates", "2", "--seed", "20000000", "--out",
                 str(tmp_path / "plan.mp4"), "--rerun-save", str(rrd)]) == 0
    table = read_recording(rrd)
    assert table["frame"] == list(range(5)) and series(table["/env/action/pusher"]).shape == (4, 2)


# --- a viewer to stream to: --rerun-connect, and --rerun's connect-or-spawn --------------------------------------

@contextlib.contextmanager
def saving_viewer(path):
    """Rerun's own viewer binary on a free loopback port, headless: it saves every stream it receives to ``path``
    (``rerun --save``), the viewer side of a live run. Yields its port; the file is complete once it exits."""
    import rerun_cli

    port = free_port()
    cmd = [str(Path(rerun_cli.__file__).parent / "rerun"), "--bind", "127.0.0.1", "--port", str(port),
           "--save", str(path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the viewer did not listen on {port}: {proc.stderr.read() if proc.poll() else ''}")
                time.sleep(0.2)
        yield port
        proc.send_signal(signal.SIGINT)  # Ctrl-C: it closes the file
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


@pytest.mark.parametrize("how", ["--rerun-connect URL", "--rerun-connect PORT", "--rerun (one is listening)"])
def test_the_viewer_receives_every_entity_the_recording_holds(how, tmp_path, monkeypatch):
    from worldstep.cli import main
    from worldstep.view import viewer as viewer_module

    received, twin = tmp_path / "viewer.rrd", tmp_path / "twin.rrd"
    with saving_viewer(received) as port:
        flags = {"--rerun-connect URL": ["--rerun-connect", f"rerun+http://127.0.0.1:{port}/proxy"],
                 "--rerun-connect PORT": ["--rerun-connect", str(port)],
                 "--rerun (one is listening)": ["--rerun"]}[how]
        monkeypatch.setattr(viewer_module, "VIEWER_PORT", port)
        monkeypatch.setenv("PATH", str(tmp_path))  # no `rerun` to spawn: --rerun must connect to the one listening
        assert main(["rollout", "--windows", "2", "--seed", "4", "--out", str(tmp_path / "r.mp4"), *flags,
                     "--rerun-save", str(twin), *FAST]) == 0
    viewer, saved = read_recording(received), read_recording(twin)
    assert saved["frame"] == list(range(9)) and len(decoded(saved["/env/frame"])) == 9  # 1 + 2 windows x 4
    assert series(saved["/env/action/droid_lerobot"]).shape == (8, 10)
    assert sorted(viewer) == sorted(saved)
    for entity, column in saved.items():
        assert viewer[entity] == column, entity


def test_rerun_without_a_viewer_executable_fails_at_once(tmp_path, monkeypatch, capsys):
    from worldstep.cli import main
    from worldstep.view import viewer as viewer_module

    monkeypatch.setattr(viewer_module, "VIEWER_PORT", free_port())  # nothing listens there
    monkeypatch.setenv("PATH", str(tmp_path))  # no `rerun` on PATH
    out = tmp_path / "r.mp4"
    assert main(["rollout", "--windows", "1", "--out", str(out), "--rerun", *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert "--rerun: no Rerun viewer listens on 127.0.0.1:" in err and "no `rerun` executable is on PATH" in err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_rerun_without_a_display_fails_at_once_and_spawns_nothing(tmp_path, monkeypatch, capsys):
    from worldstep.cli import main
    from worldstep.view import viewer as viewer_module

    spawned = tmp_path / "spawned"
    fake = tmp_path / "bin" / "rerun"  # a `rerun` that records being started
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\n: > {spawned}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(viewer_module, "VIEWER_PORT", free_port())
    monkeypatch.setattr(viewer_module.sys, "platform", "linux")
    monkeypatch.setenv("PATH", str(fake.parent))
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "WAYLAND_SOCKET"):
        monkeypatch.delenv(name, raising=False)
    assert main(["rollout", "--windows", "1", "--out", str(tmp_path / "r.mp4"), "--rerun", *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert "a native viewer needs a display" in err and "--rerun-serve" in err and len(err.splitlines()) == 1
    assert not spawned.exists()
    monkeypatch.setenv("DISPLAY", ":99")  # with a display it spawns: the fake runs, and listens on nothing
    with pytest.raises(RuntimeError, match="--rerun: the Rerun viewer spawned from .* did not listen on"):
        viewer_module.open_viewer(spawn=True)
    assert spawned.exists()
