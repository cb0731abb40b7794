"""Lightning callbacks of lit_fgrpo, installed as ``lit_fgrpo.callbacks`` (top-level ``callbacks/`` folder)."""

from lit_fgrpo.callbacks.focal_figure import FocalFigureCallback
from lit_fgrpo.callbacks.progress_bar import RLProgressBar
from lit_fgrpo.callbacks.rollout import RolloutCallback
from lit_fgrpo.callbacks.warm_start import WarmStartCallback

__all__ = ["FocalFigureCallback", "RLProgressBar", "RolloutCallback", "WarmStartCallback"]
