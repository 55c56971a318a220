"""``worldstep replay``: open-loop replay of a LeRobot dataset, flags parsed into ``worldstep.lerobot.replay``'s
call, nothing else. (``worldstep export-pushsim`` writes PushSim's clips as a dataset: a fidelity study's
command, in ``worldstep.fidelity.lerobot_export``.)"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..flags import add_flags, flag, positive_int


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


def cmd_replay(args: argparse.Namespace) -> int:
    from ..lerobot.replay import replay
    from ..lerobot.replay_report import summary_line
    from .view import closing_on_error, finish, open_from_args

    viewer = open_from_args(args)
    with closing_on_error(viewer):
        report = replay(args.dataset, args.config, out_dir=args.out, episodes=args.episodes, camera=args.camera,
                        windows=args.windows, seed=args.seed, videos=args.videos, progress=not args.quiet,
                        viewer=viewer)
    print(f"{len(report['episodes'])} episodes replayed: {summary_line(report)}; "
          f"report {Path(args.out) / 'report.json'}")
    finish(viewer)
    return 0


def add_parser(sub: argparse._SubParsersAction, add_view_flags) -> None:
    """Add ``replay`` to ``worldstep``'s subcommands."""
    p = sub.add_parser("replay", help="open-loop replay of a LeRobot dataset's recorded actions: PSNR/SSIM per "
                                      "window against the recorded frames, with baselines (docs/lerobot.md)")
    add_flags(p, ReplayFlags)
    add_view_flags(p)
    p.set_defaults(func=cmd_replay)
