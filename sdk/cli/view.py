"""The CLI's live-view flags (``--rerun``, ``--rerun-connect``, ``--rerun-save``, ``--rerun-serve``) for rollout,
eval and plan."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..flags import add_flags, flag
from ..view.viewer import DEFAULT_WEB_PORT, VIEWER_PORT, Viewer


@dataclass
class ViewFlags:
    """Watching a run live and saving its recording."""

    rerun: bool = flag(f"stream the rollout to a native Rerun viewer: connects to the one listening on port "
                       f"{VIEWER_PORT}, else spawns one", default=False)
    rerun_connect: str | None = flag("stream the rollout to a running Rerun viewer or server: "
                                     "rerun+http://HOST:PORT/proxy, or a port on 127.0.0.1", default=None,
                                     metavar="URL")
    rerun_save: str | None = flag("write a Rerun recording (open it with `rerun PATH`)", default=None,
                                  metavar="PATH.rrd")
    rerun_serve: int | None = flag(f"serve Rerun's web viewer on PORT (bare flag: {DEFAULT_WEB_PORT}) and print its "
                                   "URL; it keeps serving after the run until Ctrl-C", default=None, metavar="PORT",
                                   const=DEFAULT_WEB_PORT)


def add_view_flags(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, ViewFlags, title="live view (Rerun; pip install 'worldstep[view]')")


def wants_view(args: argparse.Namespace) -> bool:
    """Whether any live-view flag was given."""
    return bool(args.rerun or args.rerun_connect is not None or args.rerun_save or args.rerun_serve is not None)


def open_from_args(args: argparse.Namespace) -> Viewer | None:
    """The viewer the flags ask for (checked, and printed when served), or None without any."""
    if not wants_view(args):
        return None
    from ..outputs import check_output_path
    from ..view.viewer import open_viewer

    if args.rerun_save is not None:
        check_output_path(args.rerun_save, "--rerun-save")
    viewer = open_viewer(spawn=args.rerun, connect=args.rerun_connect, save=args.rerun_save,
                         serve=args.rerun_serve)
    if viewer.web_url is not None:
        print(f"watch it live: {viewer.web_url}", flush=True)
    return viewer


def logged(env: Any, viewer: Viewer | None) -> Any:
    """``env`` logged into the viewer's recording (``env`` itself without a viewer)."""
    if viewer is None:
        return env
    from ..view.loggers import RerunLogger

    return RerunLogger(env, viewer.recording)


def finish(viewer: Viewer | None) -> None:
    """Complete the recording; a served viewer keeps serving until Ctrl-C."""
    if viewer is None:
        return
    viewer.recording.flush()
    if viewer.save_path is not None:
        print(f"recording {viewer.save_path} (open it with: rerun {viewer.save_path})", flush=True)
    if viewer.web_url is not None:
        viewer.wait(f"serving the web viewer at {viewer.web_url}; Ctrl-C to stop")
    viewer.close()


@contextmanager
def closing_on_error(viewer: Viewer | None) -> Iterator[None]:
    """Close the viewer's sinks (file, servers) when the run fails; on success ``finish`` completes it."""
    try:
        yield
    except BaseException:
        if viewer is not None:
            viewer.close()
        raise
