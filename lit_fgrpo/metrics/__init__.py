"""Metrics: the unbiased pass@k estimator and its torchmetrics wrapper.

``PassAtK`` is imported on first use: importing torchmetrics takes several seconds (it pulls in its text and audio
metrics), and processes that never log a metric, such as each process of a launched vLLM server, import this
package through :mod:`lit_fgrpo`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lit_fgrpo.metrics.functional import count_true_per_row, pass_at_k

if TYPE_CHECKING:
    from lit_fgrpo.metrics.pass_at_k_metric import PassAtK

__all__ = ["PassAtK", "count_true_per_row", "pass_at_k"]


def __getattr__(name: str) -> Any:
    if name == "PassAtK":
        from lit_fgrpo.metrics.pass_at_k_metric import PassAtK

        return PassAtK
    raise AttributeError(f"module 'lit_fgrpo.metrics' has no attribute {name!r}")
