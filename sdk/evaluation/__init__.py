"""worldstep.evaluation: run a policy for episodes in a world model and write a report.

`dispatch.evaluate` is `worldstep.evaluate`, which picks the backend: `local` runs the episodes in this process
(one env at a time, or batched through a vector env), `worldstep.evaluation.distributed` on Ray actors. The per-episode
records both write (`EpisodeConfig`, `EpisodeResult`, `EvalReport`) are `worldstep.episodes`, shared with the
truth comparison, the planner and the fidelity report.

This file imports nothing, so ``worldstep.evaluate`` loads only when first used.
"""
