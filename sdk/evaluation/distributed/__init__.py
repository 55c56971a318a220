"""Scale-out evaluation: episodes sharded over Ray actors, each owning one loaded world model.

``worldstep.evaluate(model, policy, episodes, backend="ray", num_workers=N)`` (or
``worldstep eval ... --ray --workers N``) lands in :func:`evaluate_ray`. The report has the local
``report.json`` schema; the same seeds give the same per-episode results as a local run. Ray is an
optional extra: ``pip install 'worldstep[dist]'``. See ``docs/distributed.md``.
"""

from __future__ import annotations

from .ray_eval import RayUnavailableError, action_shape, driver_target, evaluate_ray, require_ray
from .shard_queue import WorkerStartError

__all__ = [
    "RayUnavailableError",
    "WorkerStartError",
    "action_shape",
    "driver_target",
    "evaluate_ray",
    "require_ray",
]
