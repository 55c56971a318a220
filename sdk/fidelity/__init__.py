"""worldstep.fidelity: measure how truthfully a world model reproduces the PushSim simulator.

`worldstep.fidelity.report.main(argv)` (``python -m worldstep.fidelity``, ``worldstep fidelity``) writes
`report.json` (per-window PSNR/SSIM/object error for kv and chained rollouts and controls, policy success rates
in both worlds and their rank correlation), PNG charts and an mp4.

A study built on the product: the measures (``worldstep.measures``), the rollout recipes (``worldstep.recipes``)
and PushSim's policies and seed splits (``worldstep.envs.push_policies``, ``push_seeds``) it uses are the
product's, and nothing in the product imports this package. This file imports nothing, so a leaf loads without
the report.
"""
