"""Read and write LeRobot datasets (v3.0, v2.1): replay, start states and imagined episodes out."""

from .format import DatasetError, DatasetInfo, EpisodeSpan, Feature, read_info
from .reader import Episode, RobotDataset, resolve_root

__all__ = ["DatasetError", "DatasetInfo", "Episode", "EpisodeSpan", "Feature", "RobotDataset", "read_info",
           "resolve_root"]
