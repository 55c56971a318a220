"""``worldstep replay`` (open-loop replay of a LeRobot dataset) and ``worldstep export-pushsim`` (PushSim's
held-out clips or expert episodes as one): flags parsed into the SDK's calls, nothing else."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from worldstep.fidelity.seeds import SPLITS
from worldstep.flags import add_flags, flag, positive_int


@dataclass
class ReplayFlags:
    """``worldstep replay``."""

    dataset: str = flag("LeRobot dataset folder (v3.0 or v2.1), or a hub id already on disk", metavar="ROOT")
    config: str = flag("config name (pusher, tiny, ...), .yaml path or checkpoint folder", default="pusher")
    episodes: str | None = flag("episodes to replay: START:STOP, N or A,B,C (default: all)", default=None)
    camera: str | None = flag("video feature to replay (default: the dataset's first camera)", default=None,
                              metavar="KEY")
    out: str = flag("folder for report.json, records/, psnr.png, ssim.png and videos/", default="runs/replay",
                    metavar="DIR")
    windows: int | None = flag("at most this many windows per episode (default: all its frames allow)",
                               default=None, type=positive_int)
    seed: int = flag("diffusion-noise seed of the i-th replayed episode: seed + i", default=0)
    videos: int = flag("side-by-side mp4s (recorded | model | first frame held) for this many episodes", default=4)
    quiet: bool = flag("no progress bar", default=False)


@dataclass
class ExportFlags:
    """``worldstep export-pushsim``."""

    out: str = flag("dataset folder to create", metavar="DIR")
    episodes: int = flag("episodes to export", default=20, type=positive_int)
    steps: int = flag("actions per episode", default=32, type=positive_int)
    split: str = flag("seed range (worldstep.fidelity.seeds): validation, test or a read one (test_read, "
                      "test_read_2, test_read_3)", default="validation", choices=tuple(SPLITS))
    codec: str = flag("video codec", default="h264", choices=("h264", "av1"))
    crf: int = flag("encoder quality, 0 .. 51 (LeRobot's default: 30)", default=30)
    pix_fmt: str = flag("yuv420p (LeRobot's) or yuv444p (full-resolution colour)", default="yuv420p",
                        choices=("yuv420p", "yuv444p"))
    source: str = flag("clips: the fidelity harness's held-out open-loop clips (clip seeds); expert: PushSim's pixel "
                       "expert from the split's episode seeds", default="clips", choices=("clips", "expert"))


def cmd_replay(args: argparse.Namespace) -> int:
    from worldstep.cli.view import closing_on_error, finish, open_from_args

    from .replay import replay
    from .replay_report import summary_line

    viewer = open_from_args(args)
    with closing_on_error(viewer):
        report = replay(args.dataset, args.config, out_dir=args.out, episodes=args.episodes, camera=args.camera,
                        windows=args.windows, seed=args.seed, videos=args.videos, progress=not args.quiet,
                        viewer=viewer)
    print(f"{len(report['episodes'])} episodes replayed: {summary_line(report)}; "
          f"report {Path(args.out) / 'report.json'}")
    finish(viewer)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .pushsim_export import export_pushsim

    root, seeds = export_pushsim(args.out, args.episodes, args.steps, split=args.split, codec=args.codec,
                                 crf=args.crf, pix_fmt=args.pix_fmt, source=args.source)
    print(json.dumps({"dataset": str(root), "clip_seeds": seeds}))
    return 0


def add_parsers(sub: argparse._SubParsersAction, add_view_flags) -> None:
    """Add ``replay`` and ``export-pushsim`` to ``worldstep``'s subcommands."""
    p = sub.add_parser("replay", help="open-loop replay of a LeRobot dataset's recorded actions: PSNR/SSIM per "
                                      "window against the recorded frames, with baselines (docs/lerobot.md)")
    add_flags(p, ReplayFlags)
    add_view_flags(p)
    p.set_defaults(func=cmd_replay)
    p = sub.add_parser("export-pushsim", help="PushSim's held-out open-loop clips, or its expert's episodes, as a "
                                              "LeRobot v3.0 dataset")
    add_flags(p, ExportFlags)
    p.set_defaults(func=cmd_export)
