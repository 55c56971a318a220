"""Open-loop replay: a recorded episode's first frame and task in, its recorded actions window by window, the
model's frames scored against the recorded ones.

Per episode: the first frame of one camera (cover-cropped to the model's size, as every first frame is) and
the task as the prompt open a session; window ``w`` feeds action rows ``w*chunk .. (w+1)*chunk - 1`` (row
``t`` is the action taken at frame ``t``) and yields frames ``w*chunk + 1 ..``, compared with the recorded
frames there, cover-cropped the same way. Two baselines are scored on the same frames: the first frame
held (a model that moves nothing) and the VAE round trip of the recorded clip (the ceiling: every model
frame goes through that decoder). Metrics are PSNR and SSIM per frame (``worldstep.measures.frames``,
the numbers of the fidelity report), averaged per window; ``replay_report`` aggregates them over episodes
with bootstrap intervals. Episodes are read one at a time and let go, so memory holds one episode's frames.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ..recipes.open_loop import RolloutRecipe, open_loop
from ..recipes.side_by_side import side_by_side_mp4
from ..recipes.vae_round_trip import vae_round_trip
from .fit import check_fits
from .reader import RobotDataset
from .replay_report import replay_report, write_replay
from .replay_scores import METRICS, EpisodeScores


def fit_frames(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """Frames ``[T, h, w, 3]`` uint8 cover-cropped to ``height x width`` exactly as a first frame is
    (``engine.vae.encoder.cover_crop``)."""
    from worldstep.engine.vae.encoder import cover_crop

    return np.stack([cover_crop(f, height, width) for f in frames])


def _window_means(values: np.ndarray, chunk: int) -> list[float]:
    return [float(v) for v in values.reshape(-1, chunk).mean(axis=1)]


def replay_episode(world, dataset: RobotDataset, index: int, camera: str, recipe: RolloutRecipe, *,
                   windows: int | None, noise_seed: int, video_path: Path | None = None,
                   on_window: Callable[..., Any] | None = None) -> EpisodeScores:
    """Replay episode ``index`` (its frames are read here and let go on return)."""
    episode = dataset.episode(index)
    chunk = recipe.chunk_size
    height, width = world.config.model.height, world.config.model.width
    count = (episode.length - 1) // chunk if windows is None else min(windows, (episode.length - 1) // chunk)
    clip = fit_frames(episode.frames[camera][:1 + count * chunk], height, width)  # [1 + W*chunk, H, W, 3]
    actions = episode.actions[:count * chunk]
    recipe = RolloutRecipe(episode.task or recipe.prompt, recipe.domain_id, recipe.knobs)
    model, _ = open_loop(world.model, clip[:1], actions[None], recipe, "kv", [noise_seed])
    truth = clip[1:]
    preds = {"model": model[0], "first_frame_held": np.repeat(clip[:1], len(truth), axis=0),
             "vae_round_trip": vae_round_trip(world.model.vae, clip)}
    result = EpisodeScores(episode.index, episode.task, count, noise_seed)
    for name, pred in preds.items():
        result.scores[name] = {m: _window_means(fn(pred, truth), chunk) for m, fn in METRICS.items()}
    if on_window is not None:
        for w in range(count):
            frames = slice(w * chunk, (w + 1) * chunk)
            on_window(w, clip[0], truth[frames], preds["model"][frames], actions[frames])
    if video_path is not None:
        columns = [clip, np.concatenate([clip[:1], preds["model"]]), np.repeat(clip[:1], len(clip), axis=0)]
        result.video = str(side_by_side_mp4(video_path, columns, fps=int(round(dataset.fps))))
    return result


def parse_episodes(text: str | None, count: int) -> list[int]:
    """``--episodes``: ``START:STOP`` (either may be empty), ``N`` or ``A,B,C``; every index in 0 .. count-1."""
    if text is None or text == ":":
        return list(range(count))
    try:
        if ":" in text:
            start, stop = (int(x) if x else None for x in text.split(":", 1))
            picked = list(range(count))[slice(start, stop)] if stop is None or stop <= count else None
            if picked is None or (start or 0) >= count:
                raise IndexError
        else:
            picked = [int(x) for x in text.split(",")]
    except (ValueError, IndexError):
        raise ValueError(f"episodes={text!r} is invalid; allowed: START:STOP, N or A,B,C within the dataset's "
                         f"{count} episodes (0 .. {count - 1})") from None
    bad = [i for i in picked if not 0 <= i < count]
    if bad or not picked:
        raise ValueError(f"episodes={text!r} is invalid; allowed: indices 0 .. {count - 1}")
    return picked


def replay(dataset: str | os.PathLike | RobotDataset, model: Any = "pusher", *, out_dir: str | os.PathLike,
           episodes: str | Sequence[int] | None = None, camera: str | None = None, windows: int | None = None,
           seed: int = 0, noise_seeds: Sequence[int] | None = None, videos: int = 4, progress: bool = True,
           viewer: Any | None = None) -> dict[str, Any]:
    """Replay recorded episodes open loop in a world model and write ``out_dir/report.json`` (see
    ``replay_report``), ``records/episodes.jsonl``, ``psnr.png``, ``ssim.png`` and ``videos/episode-XXX.mp4``
    (recorded | model | first frame held, for the first ``videos`` episodes); returns the report.

    Args:
        dataset: a LeRobot dataset folder (or hub id on disk), or a ``RobotDataset``.
        model: anything ``worldstep.load`` takes (a config name, YAML, folder, ``World``).
        episodes: which episodes: ``"0:20"``, ``"3"``, ``"1,4"`` or a list of indices (default: all).
        camera: the video feature to replay (default: the dataset's first camera).
        windows: at most this many windows per episode (default: as many as its frames allow).
        seed: diffusion-noise seed of the ``i``-th replayed episode is ``seed + i``; ``noise_seeds`` sets each.
        videos: side-by-side mp4s for this many episodes.
        viewer: a ``worldstep.view.viewer`` Viewer to log each window into (``--rerun*``), or None.
    """
    from worldstep.envs.video import frame_fps
    from worldstep.world import load, make_env


    source = dataset if isinstance(dataset, RobotDataset) else RobotDataset(dataset)
    camera = source.camera_keys[0] if camera is None and source.camera_keys else camera
    if camera not in source.camera_keys:
        raise ValueError(f"camera={camera!r} is invalid; allowed: one of the dataset's {list(source.camera_keys)}")
    if episodes is None or isinstance(episodes, str):
        picked = parse_episodes(episodes, source.num_episodes)
    else:
        picked = [int(i) for i in episodes if source.span(i) is not None]  # span() refuses a bad index
    if noise_seeds is not None and len(noise_seeds) != len(picked):
        raise ValueError(f"noise_seeds has {len(noise_seeds)} seeds; allowed: one per episode ({len(picked)})")
    if windows is not None and (not isinstance(windows, int) or windows < 1):
        raise ValueError(f"windows={windows!r} is invalid; allowed: a positive integer or None")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir={str(out)!r} is invalid: it is a file; allowed: a folder")
    world = load(model)
    env = make_env(world)
    fps, width, domain_id = frame_fps(env), int(env.action_space.shape[-1]), int(env.unwrapped.domain_id)
    env.close()
    chunk = world.knobs.chunk_size
    check_fits(source, fps=fps, action_width=width, chunk=chunk, cameras=[camera], episodes=picked)
    recipe = RolloutRecipe(world.config.env.prompt, domain_id, world.knobs)
    (out / "videos").mkdir(parents=True, exist_ok=True)
    log = _viewer_log(viewer, width)
    results = []
    for i, index in enumerate(tqdm(picked, desc="replay", unit="episode", disable=not progress)):
        on_window = None if log is None else log(index)
        results.append(replay_episode(world, source, index, camera, recipe, windows=windows,
                                      noise_seed=seed + i if noise_seeds is None else int(noise_seeds[i]),
                                      video_path=out / "videos" / f"episode-{index:03d}.mp4" if i < videos else None,
                                      on_window=on_window))
    settings = {"dataset": str(source.root), "version": source.info.version, "camera": camera, "fps": fps,
                "chunk_size": chunk, "prompt_default": world.config.env.prompt, "domain_id": domain_id,
                "model": world.config.model.name, "knobs": world.knobs.model_dump(), "seed": seed}
    report = replay_report(results, settings)
    write_replay(out, report, results)
    return report


def _viewer_log(viewer, action_width: int):
    """Per episode, a window callback logging recorded and model frames into the viewer (None: no viewer)."""
    if viewer is None:
        return None
    from worldstep.view.rerun_log import RolloutLog

    log = RolloutLog(viewer.recording, "replay", None, action_width, "png", 90)

    def episode(index: int):
        started = {"done": False}

        def on_window(w, first, truth, frames, actions):
            if not started["done"]:
                log.reset(first, None)
                started["done"] = True
            start = 1 + w * len(frames)
            log.window(w, start, frames, actions, 0.0, False, None, None)
            log.truth(truth, w, start)

        return on_window

    return episode
