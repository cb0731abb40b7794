"""Metrics: the unbiased pass@k estimator and its torchmetrics wrapper."""

from lit_fgrpo.metrics.functional import count_true_per_row, pass_at_k
from lit_fgrpo.metrics.pass_at_k_metric import PassAtK

__all__ = ["PassAtK", "count_true_per_row", "pass_at_k"]
