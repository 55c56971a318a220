"""worldstep.fidelity: measure how truthfully a world model reproduces the PushSim simulator.

`worldstep.fidelity.report.main(argv)` (``python -m worldstep.fidelity``, ``worldstep fidelity``) writes
`report.json` (per-window PSNR/SSIM/object error for kv and chained rollouts and controls, policy success rates
in both worlds and their rank correlation), PNG charts and an mp4.

This file imports nothing, so the leaves the rest of worldstep uses (``metrics``, ``policies``, ``seeds``) load
without the report, and training and planning import them at the top of their modules without a cycle.
"""
