"""Every gymnasium wrapper of a world-model env, by what it does:

- ``episode``: the env's own frames, which ``make_env`` and ``gym.make`` build from the config (``NormalizeActions``,
  ``JudgeSuccess``, ``WindowLimit``): each splits its step in halves (``SplitStep``) so the batched steppers run
  them around one engine call;
- ``record``: ``RecordRollout``, the episodes to mp4;
- ``image``: ``ImageObservation``, a window as one image;
- ``fork``: ``fork_env``, a fork inside copies of the wrappers.

The observation wrappers for several cameras and the robot state sit beside what they map
(``camera_observation.py``, ``robot_state.py``). The wrappers that log to the Rerun viewer need the SDK's viewer
and live with it: ``worldstep.view.loggers`` (``RerunLogger``, ``RerunVectorLogger``).
"""

from .episode import JudgeSuccess, NormalizeActions, SplitStep, WindowLimit
from .fork import FORKABLE_WRAPPERS, fork_env
from .image import ImageObservation
from .record import RecordRollout

__all__ = ["FORKABLE_WRAPPERS", "ImageObservation", "JudgeSuccess", "NormalizeActions", "RecordRollout", "SplitStep",
           "WindowLimit", "fork_env"]
