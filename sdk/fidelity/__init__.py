"""worldstep.fidelity: measure how truthfully a world model reproduces the PushSim simulator.

`main(argv)` writes `report.json` (per-window PSNR/SSIM/object error for kv and chained rollouts and
controls, policy success rates in both worlds and their rank correlation), PNG charts and an mp4.
"""

from __future__ import annotations

from .report import main

__all__ = ["main"]
