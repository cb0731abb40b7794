"""What :class:`~lit_fgrpo.training.update.PolicyUpdate` steps through: the optimizer step, the guard that decides
whether it is taken, and the process group.

The update itself holds no optimizer and knows no process group, so it runs the same under a Trainer and in a
user's own loop:

* :class:`OptimizerStep`: zero the gradients, backward, clip, step (the optimizer *and* its scheduler).
  :class:`LightningOptimizerStep` drives a LightningModule's manual optimization (``manual_backward``,
  ``clip_gradients``, the Trainer's optimizer and scheduler); :class:`TorchOptimizerStep` a plain torch optimizer.
* :class:`NonFiniteGuard`: no NaN or inf loss or gradient ever reaches the weights. Before each optimizer step the
  update asks :meth:`NonFiniteGuard.check` whether the step's loss and gradients are all finite (after backward,
  before gradient clipping: a NaN gradient would turn the clipping norm into NaN and spread to every gradient,
  hiding the culprit's name). If not, the step is skipped (the update zeroes the gradients and does not step), the
  skip is counted and logged, and after ``max_consecutive`` skips in a row the run stops with a
  :class:`lit_fgrpo.errors.NonFiniteError` naming the step and the first non-finite quantity. A finite step resets
  the run of skips. torch's ``clip_grad_norm_(error_if_nonfinite=True)`` raises on the first one; a single bf16
  spike should not end a long run, a persistent one must.
* :class:`~lit_fgrpo.distributed.collectives.Collectives`: the world size and every cross-rank call of the update
  (:class:`~lit_fgrpo.distributed.collectives.LightningCollectives`,
  :class:`~lit_fgrpo.distributed.collectives.TorchCollectives`; defined with the library's other collectives).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import lightning as L
import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch import Tensor, nn

from lit_fgrpo.distributed.collectives import Collectives, LightningCollectives, TorchCollectives
from lit_fgrpo.errors import NonFiniteError
from lit_fgrpo.training.module_settings import check_skip_limit

__all__ = [
    "Collectives", "LightningCollectives", "LightningOptimizerStep", "NonFiniteGuard", "OptimizerStep",
    "TorchCollectives", "TorchOptimizerStep", "first_nonfinite",
]  # fmt: skip

log = logging.getLogger(__name__)


@runtime_checkable
class OptimizerStep(Protocol):
    """One optimizer's side of the update."""

    @property
    def steps_taken(self) -> int:
        """Optimizer steps taken so far (names the step in a non-finite error; the Trainer's ``global_step``)."""
        ...

    def zero_grad(self) -> None:
        """Drop every gradient (``set_to_none``)."""
        ...

    def backward(self, loss: Tensor) -> None:
        """Accumulate ``d loss / d params`` into ``.grad``."""
        ...

    def clip(self, max_norm: float) -> None:
        """Scale the gradients so that their global L2 norm is at most ``max_norm``."""
        ...

    def step(self) -> None:
        """Apply the gradients, then advance the learning-rate schedule by one step."""
        ...


class TorchOptimizerStep:
    """:class:`OptimizerStep` over a plain torch optimizer and an optional scheduler (no Trainer).

    Args:
        optimizer: e.g. ``torch.optim.AdamW`` over the trainable parameters.
        scheduler: stepped after every optimizer step (None: no schedule).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: Any | None = None) -> None:
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.steps_taken = 0

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def clip(self, max_norm: float) -> None:
        # The parameters Lightning's norm clipping takes: every parameter of the optimizer's groups, in order.
        torch.nn.utils.clip_grad_norm_(_optimizer_params(self.optimizer), max_norm)

    def step(self) -> None:
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.steps_taken += 1


class LightningOptimizerStep:
    """:class:`OptimizerStep` of a LightningModule under manual optimization (one optimizer, one scheduler)."""

    def __init__(self, module: L.LightningModule) -> None:
        optimizer, scheduler = module.optimizers(), module.lr_schedulers()
        assert isinstance(optimizer, LightningOptimizer)
        assert isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler)
        self.module, self.optimizer, self.scheduler = module, optimizer, scheduler

    @property
    def steps_taken(self) -> int:
        return self.module.global_step

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: Tensor) -> None:
        self.module.manual_backward(loss)

    def clip(self, max_norm: float) -> None:
        self.module.clip_gradients(self.optimizer.optimizer, gradient_clip_val=max_norm)

    def step(self) -> None:
        self.optimizer.step()
        self.scheduler.step()


def _optimizer_params(optimizer: torch.optim.Optimizer) -> Sequence[nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def first_nonfinite(
    loss: Tensor | float | None, named_parameters: Iterable[tuple[str, torch.nn.Parameter]]
) -> str | None:
    """The first non-finite quantity, ``"loss"`` or ``"grad of <name>"``, or ``None`` if everything is finite.

    Parameters without a gradient are ignored. The total 2-norm of the gradients is checked first, so the common
    all-finite case costs one norm per parameter and a single device sync; only a non-finite norm looks further.
    """
    if loss is not None and not bool(torch.isfinite(torch.as_tensor(loss)).all()):
        return "loss"
    # Under FSDP2 a gradient is a DTensor: check this rank's shard only (a DTensor reduction would be a collective
    # per parameter, and a rank that stopped at its non-finite loss would not make it). Ranks agree in ``check``.
    named_grads = [(name, _local(p.grad)) for name, p in named_parameters if p.grad is not None]
    if not named_grads:
        return None
    # Fast path: a finite 2-norm over every gradient means every entry is finite (an inf or NaN entry makes it inf or
    # NaN). One reduction, no bool copy: 0.02 s against 0.27 s for isfinite().all() over SmolLM2's 135M float32
    # gradients on one CPU thread. A non-finite norm (or one that overflowed) takes the per-parameter check below.
    if bool(torch.isfinite(torch.nn.utils.get_total_norm([grad for _, grad in named_grads]))):
        return None
    flags = torch.stack([torch.isfinite(grad).all() for _, grad in named_grads])  # (num_params,)
    if bool(flags.all()):
        return None
    return f"grad of {named_grads[int((~flags).nonzero()[0])][0]}"


def _local(tensor: Tensor) -> Tensor:
    """This rank's piece of a sharded ``DTensor``; any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class NonFiniteGuard:
    """Counts skipped optimizer steps and stops the run after too many in a row.

    Args:
        max_consecutive: Skips in a row that stop the run (``--model.optimizer.max_nonfinite_skips``); >= 1.

    Attributes:
        num_skipped: Steps skipped so far in total.
        consecutive: Steps skipped since the last finite one.
    """

    def __init__(self, max_consecutive: int = 5) -> None:
        self.max_consecutive = check_skip_limit(max_consecutive)
        self.num_skipped = 0
        self.consecutive = 0

    def check(
        self,
        step: int,
        loss: Tensor | float | None,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
        any_rank: Callable[[bool], bool] | None = None,
    ) -> bool:
        """``True`` if the step may go ahead; ``False`` (counted, logged) if it must be skipped.

        Args:
            step: The optimizer step (named in the error).
            loss: This rank's loss of the step.
            named_parameters: The policy's parameters (their ``.grad``; this rank's shard under FSDP2).
            any_rank: Over several ranks: whether any rank found a non-finite value, given this rank's finding (one
                all-reduce, made by every rank). Then every rank skips the same steps and stops on the same one,
                also when the non-finite value sits in one rank's gradient shard or loss only.

        Raises:
            NonFiniteError: On the ``max_consecutive``-th skip in a row, naming the step and the quantity.
        """
        culprit = first_nonfinite(loss, named_parameters)
        elsewhere = any_rank(culprit is not None) if any_rank is not None else False
        if culprit is None and elsewhere:
            culprit = "the loss or a gradient shard of another rank"
        if culprit is None:
            self.consecutive = 0
            return True
        self.num_skipped += 1
        self.consecutive += 1
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteError(
                f"step {step}: {culprit} is not finite for the {self.consecutive}th step in a row; stopping",
                hint="lower the learning rate, check the rewards, or raise --model.optimizer.max_nonfinite_skips",
            )
        log.warning(
            "step %d: %s is not finite; optimizer step skipped (%d in a row, %d in total)",
            step,
            culprit,
            self.consecutive,
            self.num_skipped,
        )
        return False

    def state_dict(self) -> dict[str, int]:
        """Counts to store in a checkpoint."""
        return {"num_skipped": self.num_skipped, "consecutive": self.consecutive}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore the counts from :meth:`state_dict`."""
        self.num_skipped = int(state.get("num_skipped", 0))
        self.consecutive = int(state.get("consecutive", 0))
