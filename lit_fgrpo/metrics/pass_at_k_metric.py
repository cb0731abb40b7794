"""``PassAtK``: a torchmetrics Metric for the unbiased pass@k over many problems."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from lit_fgrpo.metrics.functional import count_true_per_row, pass_at_k
from lit_fgrpo.objectives.advantages import check_verdicts


class PassAtK(Metric):
    """Mean unbiased pass@k over every problem seen, for one or several k.

    ``update(correct)`` takes a (P, n) bool tensor: n samples for each of P problems. The states are sums
    (one per k, plus the problem count), so DDP reduction is exact and ``merge_state`` adds two metrics.

    ``compute()`` returns a scalar tensor for a single int k, or ``{"pass_at_1": ..., "pass_at_256": ...}``
    for a list. Keys never contain ``@`` (MLflow strips it).

    Example:
        >>> metric = PassAtK([1, 2])
        >>> metric.update(torch.tensor([[True, False], [False, False]]))
        >>> {name: round(float(v), 3) for name, v in metric.compute().items()}
        {'pass_at_1': 0.25, 'pass_at_2': 0.5}
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    pass_sum: Tensor
    num_problems: Tensor

    def __init__(self, k: int | Sequence[int] = 1, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(**kwargs)
        ks = [k] if isinstance(k, int) else list(k)
        if not ks:
            raise ValueError("PassAtK: k must be an int or a non-empty list of ints")
        for value in ks:
            if int(value) != value or value < 1:
                raise ValueError(f"PassAtK: every k must be an integer >= 1, got {value}")
        self.ks: list[int] = [int(v) for v in ks]
        self.single = isinstance(k, int)
        self.add_state("pass_sum", default=torch.zeros(len(self.ks), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_problems", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, correct: Tensor) -> None:  # type: ignore[override]
        """Add P problems with n samples each; ``correct`` is (P, n) bool (0/1 integers are accepted).

        Raises:
            ValueError: If ``correct`` is not 2-D, holds floats (probabilities are not verdicts) or values outside
                {0, 1}, or has fewer than k samples per problem.
        """
        if correct.dim() != 2:
            raise ValueError(f"PassAtK.update: correct must be (P, n), got shape {tuple(correct.shape)}")
        check_verdicts("PassAtK.update: correct", correct)
        correct = correct.to(torch.bool)
        n = correct.shape[1]
        if n < max(self.ks):
            raise ValueError(f"PassAtK.update: {n} samples per problem is fewer than k={max(self.ks)}")
        num_correct = count_true_per_row(correct)  # (P,)
        num_samples = torch.full_like(num_correct, n)  # (P,)
        values = torch.stack([pass_at_k(num_samples, num_correct, k) for k in self.ks])  # (K, P)
        self.pass_sum += values.sum(dim=1).to(self.pass_sum.device)
        self.num_problems += correct.shape[0]

    def compute(self) -> Tensor | dict[str, Tensor]:  # type: ignore[override]
        """Mean pass@k over the problems seen."""
        mean = self.pass_sum / self.num_problems.clamp(min=1)  # (K,)
        if self.single:
            return mean[0]
        return {f"pass_at_{k}": mean[i] for i, k in enumerate(self.ks)}
