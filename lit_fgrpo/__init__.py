"""lit_fgrpo: F-GRPO (focal group-relative policy optimisation) for PyTorch Lightning.

The algorithm lives in :mod:`lit_fgrpo.objectives` and :mod:`lit_fgrpo.metrics` (pure tensor functions);
Lightning glue (module, data module, callbacks, CLI) is imported lazily so ``import lit_fgrpo`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lit_fgrpo.metrics import pass_at_k
from lit_fgrpo.objectives import focal_weight, group_advantages, kl_k3, policy_loss
from lit_fgrpo.theory import tail_miss_probability

if TYPE_CHECKING:
    from lit_fgrpo.metrics.pass_at_k_metric import PassAtK

__version__ = "0.1.0"

_LAZY = {
    "FGRPOModule": "lit_fgrpo.training.module",
    "PromptDataModule": "lit_fgrpo.data",
    "PolicySettings": "lit_fgrpo.training.module_settings",
    "ObjectiveSettings": "lit_fgrpo.training.module_settings",
    "OptimizerSettings": "lit_fgrpo.training.module_settings",
    "BatchingSettings": "lit_fgrpo.training.module_settings",
    "SamplingConfig": "lit_fgrpo.engines.base",
    "PassAtK": "lit_fgrpo.metrics.pass_at_k_metric",  # torchmetrics takes seconds to import
}
"""Public names kept stable across the package's layout: ``from lit_fgrpo import FGRPOModule, PolicySettings``."""

__all__ = [
    "BatchingSettings",
    "FGRPOModule",
    "ObjectiveSettings",
    "OptimizerSettings",
    "PolicySettings",
    "SamplingConfig",
    "PassAtK",
    "PromptDataModule",
    "focal_weight",
    "group_advantages",
    "kl_k3",
    "pass_at_k",
    "policy_loss",
    "tail_miss_probability",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lit_fgrpo' has no attribute {name!r}")
