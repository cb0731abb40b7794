"""``PassAtK``: a torchmetrics Metric for the unbiased pass@k over many problems."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

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

    ``statistic="ci95"`` makes ``compute()`` return the half-width of the normal 95 % interval of that mean over
    problems instead (keys ``ci95_pass_at_<k>``): with x_p the pass@k of problem p over P problems,
    ``1.96 * sqrt(sum_p (x_p - mean)^2 / (P - 1) / P)``, NaN below 2 problems. The held-out questions are a sample
    of the task's, so this is the interval a second draw of questions would fall in; :meth:`half_width` gives it
    beside the mean of the same metric.

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
    pass_sq_sum: Tensor
    num_problems: Tensor

    def __init__(  # type: ignore[no-untyped-def]
        self, k: int | Sequence[int] = 1, statistic: Literal["mean", "ci95"] = "mean", **kwargs
    ) -> None:
        super().__init__(**kwargs)
        if statistic not in ("mean", "ci95"):
            raise ValueError(f"PassAtK: statistic must be 'mean' or 'ci95', got {statistic!r}")
        self.statistic = statistic
        ks = [k] if isinstance(k, int) else list(k)
        if not ks:
            raise ValueError("PassAtK: k must be an int or a non-empty list of ints")
        for value in ks:
            if int(value) != value or value < 1:
                raise ValueError(f"PassAtK: every k must be an integer >= 1, got {value}")
        self.ks: list[int] = [int(v) for v in ks]
        self.single = isinstance(k, int)
        self.add_state("pass_sum", default=torch.zeros(len(self.ks), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("pass_sq_sum", default=torch.zeros(len(self.ks), dtype=torch.float64), dist_reduce_fx="sum")
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
        self.pass_sq_sum += (values.to(torch.float64) ** 2).sum(dim=1).to(self.pass_sq_sum.device)
        self.num_problems += correct.shape[0]

    def _half_widths(self) -> Tensor:
        n = self.num_problems
        mean = self.pass_sum / n.clamp(min=1)  # (K,)
        # sum of squared deviations from the sums; clamped: rounding can make an all-equal sample's slightly negative
        squares = (self.pass_sq_sum - n * mean**2).clamp(min=0)  # (K,)
        if float(n) < 2:
            return torch.full_like(mean, math.nan)
        return 1.96 * (squares / (n - 1) / n).sqrt()  # (K,)

    def half_width(self) -> dict[str, float]:
        """``{"ci95_pass_at_<k>": half-width}`` of the 95 % interval of each mean (see the class docstring)."""
        return {f"ci95_pass_at_{k}": float(v) for k, v in zip(self.ks, self._half_widths(), strict=True)}

    def compute(self) -> Tensor | dict[str, Tensor]:  # type: ignore[override]
        """Mean pass@k over the problems seen (or its 95 % half-width, with ``statistic="ci95"``)."""
        if self.statistic == "ci95":
            values = self._half_widths()  # (K,)
            prefix = "ci95_pass_at_"
        else:
            values = self.pass_sum / self.num_problems.clamp(min=1)  # (K,)
            prefix = "pass_at_"
        if self.single:
            return values[0]
        return {f"{prefix}{k}": values[i] for i, k in enumerate(self.ks)}
