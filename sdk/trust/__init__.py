"""Which of a world model's successes can be trusted: per-window trust signals, a selective judge that abstains
where a frozen rule's thresholds fail, and success rates corrected by a few paired simulator (or robot) runs."""

from .inverse_dynamics import CosmosInverseDynamics, InverseDynamicsTracker
from .ppi import PPIRate, ppi_rate
from .rule import SelectiveRule
from .selective import SelectiveJudge
from .signals import TrustSignals, TrustSignalsWrapper, trained_horizon_for, trained_horizon_of
from .trackers import PushTracker, Tracker
from .vector import TrustSignalsVectorWrapper

__all__ = ["CosmosInverseDynamics", "InverseDynamicsTracker", "PPIRate", "PushTracker", "SelectiveJudge",
           "SelectiveRule", "Tracker", "TrustSignals", "TrustSignalsVectorWrapper", "TrustSignalsWrapper", "ppi_rate",
           "trained_horizon_for", "trained_horizon_of"]
