"""Open-loop replay of LeRobot datasets (`worldstep.lerobot.replay`, `worldstep replay`): report, records, plots
and videos; the baselines' scores recomputed here; streams 20 episodes holding one at a time (counted); refuses
a dataset that does not fit before any rollout; on the shipped pusher model its per-window PSNR is the fidelity
harness's open-loop PSNR on the same clips, within a stated bound."""

from __future__ import annotations

import json
import re
import weakref

import numpy as np
import pytest
from lerobot_data import CAMERAS, episodes, write_v30
from tiny_world import cache_dir, world  # noqa: F401 - fixtures
from worldstep.lerobot import DatasetError, RobotDataset
from worldstep.lerobot import reader as reader_module
from worldstep.lerobot.replay import fit_frames, parse_episodes, replay
from worldstep.lerobot.replay_scores import SERIES
from worldstep.measures.frames import psnr

CHUNK = 4


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Three episodes shaped for the tiny model's embodiment (15 fps, 10-wide actions): 48x64 frames, cover-cropped
    into the model's 32x32; 9, 5 and 12 frames (2, 1 and 2 windows)."""
    root = tmp_path_factory.mktemp("replay") / "ds"
    return write_v30(root, episodes([9, 5, 12], seed=2), fps=15, codec="h264")


def test_replay_writes_report_records_plots_and_videos(world, recorded, tmp_path):  # noqa: F811
    report = replay(recorded, world, out_dir=tmp_path / "out", camera=CAMERAS[1], videos=2, progress=False)
    assert report["episodes"] == [0, 1, 2] and report["windows"] == [2, 1, 2]
    assert report["settings"]["camera"] == CAMERAS[1] and report["settings"]["chunk_size"] == CHUNK
    for name in SERIES:
        for metric in ("psnr_db", "ssim"):
            s = report["series"][name][metric]
            assert s["episodes"] == [3, 2] and len(s["value"]) == 2
            assert all(lo <= v <= hi for v, lo, hi in zip(s["value"], s["low"], s["high"]))
    rows = [json.loads(line) for line in (tmp_path / "out" / "records" / "episodes.jsonl").read_text().splitlines()]
    assert [r["episode"] for r in rows] == [0, 1, 2] and [r["task"] for r in rows] == ["task 0", "task 1", "task 2"]
    # the held first frame's score, recomputed from the dataset's own frames
    frames = RobotDataset(recorded).episode(2).frames[CAMERAS[1]]
    clip = fit_frames(frames[:1 + 2 * CHUNK], 32, 32)
    held = psnr(np.repeat(clip[:1], 2 * CHUNK, axis=0), clip[1:]).reshape(2, CHUNK).mean(axis=1)
    np.testing.assert_allclose(rows[2]["first_frame_held"]["psnr_db"], held)
    window_mean = np.nanmean([[r["model"]["psnr_db"][0] for r in rows]])
    assert report["series"]["model"]["psnr_db"]["value"][0] == pytest.approx(window_mean)
    assert (tmp_path / "out" / "psnr.png").stat().st_size > 0 and (tmp_path / "out" / "ssim.png").stat().st_size > 0
    assert sorted(p.name for p in (tmp_path / "out" / "videos").iterdir()) == ["episode-000.mp4", "episode-001.mp4"]


def test_replay_is_reproducible_per_seed(world, recorded, tmp_path):  # noqa: F811
    a = replay(recorded, world, out_dir=tmp_path / "a", episodes="0", videos=0, progress=False, seed=5)
    b = replay(recorded, world, out_dir=tmp_path / "b", episodes=[0], videos=0, progress=False, seed=5)
    assert a["series"]["model"] == b["series"]["model"]


def test_replay_refuses_a_dataset_that_does_not_fit(world, tmp_path, monkeypatch):  # noqa: F811
    root = write_v30(tmp_path / "ds", episodes([9, 3], action_width=7), fps=30, codec="h264")
    from worldstep.lerobot import replay as replay_module

    monkeypatch.setattr(replay_module, "open_loop", None)  # any rollout would fail on this
    with pytest.raises(DatasetError) as caught:
        replay(root, world, out_dir=tmp_path / "out", progress=False)
    message = str(caught.value)
    assert "fps: the dataset records 30" in message and "takes 10" in message and "1 (3 frames)" in message
    with pytest.raises(ValueError, match="camera='observation.images.top' is invalid"):
        replay(root, world, out_dir=tmp_path / "out", camera="observation.images.top", progress=False)


def test_episode_ranges():
    assert parse_episodes("0:20", 30) == list(range(20)) and parse_episodes(None, 3) == [0, 1, 2]
    assert parse_episodes("2:", 4) == [2, 3] and parse_episodes("1,3", 4) == [1, 3] and parse_episodes("2", 4) == [2]
    for bad in ("0:21", "4", "a:b", "5:", "3,9", "2:1"):
        with pytest.raises(ValueError, match=f"episodes={bad!r} is invalid"):
            parse_episodes(bad, 20 if bad == "0:21" else 4)


def test_replaying_twenty_episodes_holds_one_at_a_time(world, tmp_path, monkeypatch):  # noqa: F811
    root = write_v30(tmp_path / "ds", episodes([5] * 20, seed=4), fps=15, codec="h264")
    alive, peak = [], []
    decode = reader_module.decode_span

    def counting(path, from_s, count, fps):
        clip = decode(path, from_s, count, fps)
        episode = round(from_s * fps) // 5
        peak.append(len({e for e, ref in alive if ref() is not None and e != episode}))
        alive.append((episode, weakref.ref(clip)))
        return clip

    monkeypatch.setattr(reader_module, "decode_span", counting)
    report = replay(RobotDataset(root, cameras=[CAMERAS[0]]), world, out_dir=tmp_path / "out", videos=0,
                    progress=False)
    assert len(report["episodes"]) == 20 and len(peak) == 20
    assert max(peak) == 0, peak  # no other episode's frames alive when one is decoded


def test_cli_replay_and_export(tmp_path, capsys):
    from worldstep.cli import main

    assert main(["export-pushsim", "--out", str(tmp_path / "push"), "--episodes", "2", "--steps", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["clip_seeds"] == [20_005_000, 20_005_001]
    assert main(["replay", "--dataset", str(tmp_path / "push"), "--out", str(tmp_path / "out"), "--quiet",
                 "--videos", "1"]) == 0
    out = capsys.readouterr().out
    assert "2 episodes replayed: PSNR (dB): model" in out and "held first frame" in out and "SSIM: model" in out
    assert json.loads((tmp_path / "out" / "report.json").read_text())["windows"] == [1, 1]
    assert main(["replay", "--dataset", str(tmp_path / "push"), "--episodes", "0:9", "--out", str(tmp_path / "x")]) == 2
    assert "episodes='0:9' is invalid" in capsys.readouterr().err


# The bound of the pusher comparison: with frames stored at full colour resolution and H.264 at crf 0, the only
# difference between replaying the dataset and the fidelity harness's clips is the RGB -> YUV -> RGB rounding of
# the stored frames (first frame and truth). Measured 0.04 dB at most over 4 clips x 4 windows (the command in
# docs/lerobot.md); asserted within 0.15 dB. With LeRobot's default encoding (yuv420p, crf 30) the replayed PSNR
# reads lower by 1.3 dB on average (2.2 dB at most) on the same clips: the codec's loss on the recorded frames.
PUSHER_BOUND_DB = 0.15


def test_pusher_replay_equals_the_fidelity_harness(tmp_path):
    import worldstep
    from worldstep.fidelity.lerobot_export import PROMPT, export_pushsim
    from worldstep.fidelity.openloop import held_out, per_window, score_frames
    from worldstep.recipes.open_loop import RolloutRecipe, open_loop

    root, seeds = export_pushsim(tmp_path / "push", 3, 8, crf=0, pix_fmt="yuv444p")
    pusher = worldstep.load("pusher")
    replay(root, pusher, out_dir=tmp_path / "out", noise_seeds=seeds, videos=0, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "out" / "records" / "episodes.jsonl").read_text().splitlines()]
    held = held_out(seeds, 8)
    frames, _ = open_loop(pusher.model, held.first, held.actions, RolloutRecipe(PROMPT, 0, pusher.knobs), "kv", seeds)
    harness = per_window(score_frames(frames, held).psnr, CHUNK)  # [clips, windows], as the fidelity report
    replayed = np.array([r["model"]["psnr_db"] for r in rows])
    assert replayed.shape == harness.shape == (3, 2)
    assert np.abs(replayed - harness).max() <= PUSHER_BOUND_DB, (replayed, harness)
    # the check can fail: other noise seeds give other frames
    replay(root, pusher, out_dir=tmp_path / "other", seed=7, videos=0, progress=False)
    other = [json.loads(line)["model"]["psnr_db"]
             for line in (tmp_path / "other" / "records" / "episodes.jsonl").read_text().splitlines()]
    assert np.abs(np.array(other) - harness).max() > PUSHER_BOUND_DB


def test_pusher_replay_of_expert_episodes_equals_the_harness_on_their_actions(tmp_path):
    """PushSim's pixel expert from validation episode seeds, exported and replayed: the harness's open-loop
    rollout and PSNR on the same first frames, actions and noise seeds agree within the same bound."""
    import worldstep
    from worldstep.fidelity.lerobot_export import PROMPT, expert_episode, export_pushsim
    from worldstep.fidelity.openloop import per_window
    from worldstep.recipes.open_loop import RolloutRecipe, open_loop

    root, seeds = export_pushsim(tmp_path / "expert", 2, 8, crf=0, pix_fmt="yuv444p", source="expert")
    assert seeds == [20_000_000, 20_000_001]
    pusher = worldstep.load("pusher")
    replay(root, pusher, out_dir=tmp_path / "out", noise_seeds=seeds, videos=0, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "out" / "records" / "episodes.jsonl").read_text().splitlines()]
    episodes = [expert_episode(seed, 8) for seed in seeds]
    first = np.stack([frames[0] for frames, _, _ in episodes])
    truth = np.stack([frames[1:] for frames, _, _ in episodes])
    actions = np.stack([a for _, _, a in episodes])
    assert np.abs(np.diff(actions, axis=0)).max() > 0  # the expert acted differently per seed
    pred, _ = open_loop(pusher.model, first, actions, RolloutRecipe(PROMPT, 0, pusher.knobs), "kv", seeds)
    harness = per_window(psnr(pred, truth), CHUNK)
    replayed = np.array([r["model"]["psnr_db"] for r in rows])
    assert np.abs(replayed - harness).max() <= PUSHER_BOUND_DB, (replayed, harness)


def test_the_replays_ssim_is_scikit_images():
    """Replay scores SSIM with `worldstep.measures.frames.ssim` (the fidelity report's one definition); it is
    scikit-image's `structural_similarity` with Wang et al.'s settings (Gaussian window, sigma 1.5, population
    covariance, data range 255), to rounding. The check can fail: another window is another number."""
    from skimage.metrics import structural_similarity
    from worldstep.measures.frames import ssim

    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (3, 40, 48, 3), dtype=np.uint8)
    b = np.clip(a.astype(int) + rng.integers(-40, 40, a.shape), 0, 255).astype(np.uint8)

    def reference(sigma):
        return np.array([structural_similarity(x, y, gaussian_weights=True, sigma=sigma, use_sample_covariance=False,
                                               data_range=255, channel_axis=-1) for x, y in zip(a, b)])

    np.testing.assert_allclose(ssim(a, b), reference(1.5), atol=1e-12)
    assert np.abs(ssim(a, b) - reference(1.0)).max() > 1e-3


def test_replay_logs_recorded_and_model_frames_to_rerun(tmp_path, capsys):
    """`worldstep replay --rerun-save`: the recording holds the model's frames and the recorded ones, window by
    window, and each window's PSNR, read back through Rerun's own dataframe API."""
    from rerun_tables import decoded, read_recording, scalars
    from worldstep.cli import main

    assert main(["export-pushsim", "--out", str(tmp_path / "push"), "--episodes", "1", "--steps", "8"]) == 0
    assert main(["replay", "--dataset", str(tmp_path / "push"), "--out", str(tmp_path / "out"), "--quiet",
                 "--videos", "0", "--rerun-save", str(tmp_path / "run.rrd")]) == 0
    table = read_recording(tmp_path / "run.rrd")
    model = [b for b in table["/replay/frame"] if b is not None]
    truth = [b for b in table["/replay/truth/frame"] if b is not None]
    assert decoded(model).shape == (1 + 8, 64, 64, 3) and decoded(truth).shape == (8, 64, 64, 3)
    logged = [v for v in scalars(table["/replay/truth/psnr_db"]) if v is not None]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    np.testing.assert_allclose(logged, report["series"]["model"]["psnr_db"]["value"], rtol=1e-6)


def _scores(index: int, model: float, held: float, vae: float, ssim: tuple[float, float, float]):
    from worldstep.lerobot.replay_scores import EpisodeScores

    psnr_values = {"model": model, "first_frame_held": held, "vae_round_trip": vae}
    scores = {s: {"psnr_db": [psnr_values[s] + 0.1 * w for w in range(3)], "ssim": [ssim[k]] * 3}
              for k, s in enumerate(SERIES)}
    return EpisodeScores(index=index, task="push", windows=3, noise_seed=index, scores=scores)


def test_the_summary_shows_both_baselines_per_metric_with_a_verdict(tmp_path):
    """The issue's case: PSNR above the held frame and below the round trip, SSIM below both (the held frame
    beats the "ceiling" on SSIM); the summary says so per metric."""
    from worldstep.lerobot.replay_report import replay_report, summary_line, write_replay

    rng = np.random.default_rng(0)
    results = [_scores(i, 23.9 + rng.normal(0, 0.1), 23.0 + rng.normal(0, 0.1), 25.1 + rng.normal(0, 0.1),
                       (0.78 + rng.normal(0, 0.01), 0.87 + rng.normal(0, 0.01), 0.81 + rng.normal(0, 0.01)))
               for i in range(8)]
    report = replay_report(results, {})
    verdicts = {m: {b: v["verdict"] for b, v in report["verdicts"][m].items()} for m in report["verdicts"]}
    assert verdicts == {"psnr_db": {"first_frame_held": "above", "vae_round_trip": "below"},
                        "ssim": {"first_frame_held": "below", "vae_round_trip": "below"}}
    line = summary_line(report)
    assert re.match(r"PSNR \(dB\): model 24\.\d\d \[2\d\.\d\d, 2\d\.\d\d\], held first frame 23\.\d\d, VAE round trip "
                    r"25\.\d\d: ", line), line
    assert "model above the held first frame, below the VAE round trip" in line
    assert re.search(r"SSIM: model 0\.78\d \[0\.\d{3}, 0\.\d{3}\], held first frame 0\.8[67]\d", line), line
    assert "SSIM" in line.split("; ")[1] and "model below the held first frame, below the VAE round trip" in line
    assert "ceiling" not in report["notes"] and "floor" not in report["notes"]
    tied = [_scores(i, 24.0 + (-1) ** i, 24.0, 24.0 + (-1) ** (i + 1), (0.8, 0.8, 0.8)) for i in range(8)]
    assert {v["verdict"] for v in replay_report(tied, {})["verdicts"]["psnr_db"].values()} == {"within"}
    write_replay(tmp_path, report, results)
    from PIL import Image
    from worldstep.charts import line_chart

    plain = line_chart(tmp_path / "plain.png", {k: report["series"][k]["ssim"]["value"] for k in SERIES}, "", "", "")
    drawn = np.asarray(Image.open(tmp_path / "ssim.png"))
    assert drawn.shape == np.asarray(Image.open(plain)).shape and (drawn != np.asarray(Image.open(plain))).any()
