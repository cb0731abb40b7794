"""Lightning callbacks of lit_fgrpo, installed as ``lit_fgrpo.callbacks`` (top-level ``callbacks/`` folder)."""

from lit_fgrpo.callbacks.rollout import RolloutCallback
from lit_fgrpo.callbacks.warm_start import WarmStartCallback

__all__ = ["RolloutCallback", "WarmStartCallback"]
