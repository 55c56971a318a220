"""The embodiment and action domain: which robots a model takes (names, domain ids, exact action widths, fps,
view points), their action conventions and statistics, and the conditioning record a session is opened with.
No model code: any world model that takes embodiments uses it."""

from __future__ import annotations

from .action_convention import ActionConvention
from .action_normalizer import ActionNormalizer, ActionRangeWarning
from .action_stats import ActionStats
from .conditioning import Conditioning
from .embodiment import Embodiment
from .embodiments import EmbodimentRegistry

__all__ = ["ActionConvention", "ActionNormalizer", "ActionRangeWarning", "ActionStats", "Conditioning", "Embodiment",
           "EmbodimentRegistry"]
