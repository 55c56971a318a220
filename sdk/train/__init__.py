"""worldstep.train: train the `pusher` world model from the PushSim simulator on CPU.

`main(argv)` runs data generation, the VAE, latent encoding and forward-dynamics training, and
writes a checkpoint in the diffusers layout that `Cosmos3WorldModel.from_pretrained` reads.
"""

from __future__ import annotations

from .args import TrainArgs
from .loop import main

__all__ = ["TrainArgs", "main"]
