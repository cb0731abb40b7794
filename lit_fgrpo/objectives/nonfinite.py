"""The non-finite guard: no NaN or inf loss or gradient ever reaches the weights.

Before each optimizer step the module asks :meth:`NonFiniteGuard.check` whether the step's loss and gradients are
all finite. If not, the step is skipped (the caller zeroes the gradients and does not call ``optimizer.step()``), the
skip is counted and logged, and after ``max_consecutive`` skips in a row the run stops with a
:class:`lit_fgrpo.errors.NonFiniteError` naming the step and the first non-finite quantity. A finite step resets the
run of skips. torch's ``clip_grad_norm_(error_if_nonfinite=True)`` raises on the first one; a single bf16 spike should
not end a long run, a persistent one must.

Where it goes in ``PolicyUpdate.step`` (``lit_fgrpo/training/update.py``; after backward, before gradient clipping and ``optimizer.step()``: a NaN
gradient would turn the clipping norm into NaN and spread to every gradient, hiding the culprit's name)::

    if self.nonfinite_guard.check(step=self.global_step, loss=loss, named_parameters=self.policy.named_parameters()):
        optimizer.step(); scheduler.step()
    else:
        optimizer.zero_grad(set_to_none=True)
        self.log("train/nonfinite_skips", float(self.nonfinite_guard.num_skipped))
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from lit_fgrpo.errors import ConfigError, NonFiniteError

log = logging.getLogger(__name__)


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


def check_skip_limit(value: float) -> int:
    """``value`` as the int limit of skips in a row.

    Raises:
        ConfigError: ``--model.optimizer.max_nonfinite_skips must be an integer >= 1, got 0`` (and for 1.5).
    """
    if int(value) != value or value < 1:
        raise ConfigError(f"--model.optimizer.max_nonfinite_skips must be an integer >= 1, got {value}")
    return int(value)


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
