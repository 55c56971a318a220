"""Rollout recipes every part uses: open loop (``open_loop``), the VAE round trip (``vae_round_trip``) and the
side-by-side video (``side_by_side``). Replay (``worldstep.lerobot``) and the fidelity studies both call them;
they live in the product so that replay needs nothing from the studies.

This file imports nothing.
"""
