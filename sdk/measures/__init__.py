"""Measures every part of worldstep uses: frame quality (``frames``: PSNR, SSIM), rank agreement (``ranks``:
Pearson, Spearman) and estimates with 95% intervals (``intervals``: bootstrap, Wilson). The product holds them so
that the env, replay, the planner and the viewer need nothing from the fidelity studies, which import them too.

This file imports nothing: ``frames`` loads torch, which ``ranks`` and ``intervals`` do not need.
"""
