"""The embodiment and action domain: which robots a model takes (names, domain ids, exact action widths, fps,
view points), their action conventions and statistics, and the conditioning record a session is opened with.
No model code: any world model that takes embodiments uses it.

The package re-exports what imports with numpy alone (LeRobot's venv loads `ActionNormalizer` through the
worldstep plugin, beside a diffusers without Cosmos3). `EmbodimentRegistry` (`embodiments`) and `Conditioning`
(`conditioning`) read the installed diffusers' Cosmos3 tables when imported: import them from their modules.
"""

from __future__ import annotations

from .action_convention import ActionConvention
from .action_normalizer import ActionNormalizer, ActionRangeWarning
from .action_stats import ActionStats
from .embodiment import Embodiment

__all__ = ["ActionConvention", "ActionNormalizer", "ActionRangeWarning", "ActionStats", "Embodiment"]
