"""`worldstep bench`: measured speed against the alternatives, side by side in one run.

Subcommands (`worldstep bench <name> [--json PATH]`, or `python -m worldstep.bench <name>`):
`rollout`, `decode`, `vector`, `soak`, `gpu`, `profile`. Each prints tables and, with `--json`,
writes the figures that `python -m worldstep.bench.report` turns into the README's tables.
Heavy imports (torch, diffusers) happen only when a bench runs.
"""

from .cli import add_parser, main

__all__ = ["add_parser", "main"]
