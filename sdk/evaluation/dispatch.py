"""``evaluate``: run a policy for episodes in a world model, here or on Ray actors, and write a report."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..episodes import EpisodeConfig, EvalReport
from ..policies import Policy, as_policy
from ..trust.ppi import check_pairs, with_corrected_rate
from .distributed import evaluate_ray
from .local import evaluate_local

__all__ = ["evaluate"]


def evaluate(env_or_model: Any, policy: Policy, episodes: int | Sequence[dict | EpisodeConfig] = 1, *,
             success_fn: Callable[[np.ndarray], bool] | None = None,
             out_dir: str | os.PathLike = "runs/eval", batched: bool = False, batch_size: int | None = None,
             seed: int = 0, record_video: bool = True, progress: bool = True,
             backend: Literal["local", "ray"] = "local", ray_address: str | None = None,
             num_workers: int | None = None, run_info: dict[str, Any] | None = None,
             lerobot_out: str | os.PathLike | None = None,
             paired_outcomes: Sequence[tuple[bool, bool]] | None = None) -> EvalReport:
    """Run ``policy`` for ``episodes`` and write ``out_dir/report.json`` plus one mp4 per episode.

    An episode whose policy raises is kept in the report with ``status: "failed"`` and its ``error`` (and
    named on stderr as it happens); the other episodes still run. When every episode failed, the report says
    ``"status": "failed"`` with the first error, and ``EvaluationFailed`` is raised after it is written.

    Args:
        env_or_model: a worldstep env (``gym.make(...)``, ``make_env(...)``), a ``WorldModelVectorEnv``
            (implies ``batched``), or anything :func:`worldstep.load` takes (``"tiny"``, a ``World``, ...).
        policy: a :class:`~worldstep.policies.Policy`, or a plain callable ``obs -> actions`` (anything else is a
            ``TypeError`` before the first episode); batched runs use one deep copy per episode slot.
        episodes: a count, or a list of dicts / :class:`EpisodeConfig` (seed, prompt, domain_id, image,
            max_windows; a missing ``max_windows`` is the env's, i.e. the config's ``env.max_windows``).
        success_fn: ``frames -> bool`` per window; ends the episode as a success. Give it here when
            ``env_or_model`` is a model; an env you built carries its own.
        out_dir: where ``report.json`` and ``episode-XXX.mp4`` go (each written under a temporary name and
            renamed when complete; Ctrl-C writes ``report.json`` with ``"status": "interrupted"`` and the
            episodes that finished, then re-raises ``KeyboardInterrupt``).
        batched: step episodes together through one vector env (one batched forward per step).
        batch_size: episodes per batch (default: all of them).
        seed: seed of episode ``i`` when it has none is ``seed + i``.
        record_video: write the mp4 files.
        progress: show a progress bar over windows.
        backend: ``"local"`` runs here; ``"ray"`` shards episodes over Ray actors, each loading its own
            copy of the model (needs ``pip install 'worldstep[dist]'``; see ``docs/distributed.md``).
        ray_address: the Ray cluster to join (None: ``$RAY_ADDRESS``, else a new local one); ray only.
        num_workers: Ray actors, one model each (default 2); ray only.
        run_info: recorded as ``run`` in ``report.json`` (JSON-serialisable).
        lerobot_out: also write the episodes as a LeRobot v3.0 dataset in this new folder (frames, actions,
            state, prompt as task, success; ``worldstep.lerobot.imagined``), renamed into place when the run
            completes; local runs, batched or not.
        paired_outcomes: n pairs ``(model_success, true_success)`` of the same episodes run in this model and in
            the truth (a simulator, a robot): ``report.json`` then also holds ``corrected_success_rate``, this
            run's rate corrected by them with a valid 95% interval (``worldstep.trust.ppi_rate``).
    """
    pairs = None if paired_outcomes is None else check_pairs("paired_outcomes", paired_outcomes)
    policy = as_policy(policy)
    if backend not in ("local", "ray"):
        raise ValueError(f"backend={backend!r} is invalid; allowed: 'local' or 'ray'")
    if lerobot_out is not None and backend == "ray":
        raise ValueError("lerobot_out is invalid with backend='ray'; allowed: a local run")
    if lerobot_out is not None and Path(lerobot_out).exists():
        raise ValueError(f"lerobot_out={str(lerobot_out)!r} is invalid: it exists; allowed: a folder that does not "
                         "exist yet")
    if pairs is not None:
        report = evaluate(env_or_model, policy, episodes, success_fn=success_fn, out_dir=out_dir, batched=batched,
                          batch_size=batch_size, seed=seed, record_video=record_video, progress=progress,
                          backend=backend, ray_address=ray_address, num_workers=num_workers, run_info=run_info,
                          lerobot_out=lerobot_out)
        return with_corrected_rate(report, pairs, Path(out_dir))
    if backend != "ray" and (ray_address is not None or num_workers is not None):
        raise ValueError("ray_address and num_workers only apply with backend='ray'")
    if backend == "ray":
        report = evaluate_ray(env_or_model, policy, episodes, success_fn=success_fn, out_dir=out_dir,
                              batched=batched, batch_size=batch_size, seed=seed, record_video=record_video,
                              progress=progress, ray_address=ray_address,
                              num_workers=2 if num_workers is None else num_workers, run_info=run_info)
    else:
        report = evaluate_local(env_or_model, policy, episodes, seed=seed, success_fn=success_fn,
                                out_dir=Path(out_dir), batched=batched, batch_size=batch_size,
                                record_video=record_video, progress=progress, run_info=run_info,
                                lerobot_out=lerobot_out)
    report.check_not_all_failed(Path(out_dir) / "report.json")
    return report
