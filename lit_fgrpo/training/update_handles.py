"""The two handles :class:`~lit_fgrpo.training.update.PolicyUpdate` runs through: the optimizer step and the collectives.

The update itself holds no optimizer and knows no process group, so it runs the same under a Trainer and in a
user's own loop:

* :class:`OptimizerStep`: zero the gradients, backward, clip, step (the optimizer *and* its scheduler).
  :class:`LightningOptimizerStep` drives a LightningModule's manual optimization (``manual_backward``,
  ``clip_gradients``, the Trainer's optimizer and scheduler); :class:`TorchOptimizerStep` a plain torch optimizer.
* :class:`Collectives`: the world size and the two reductions the update makes (the token count's sum, the
  busiest rank's micro-batch count). :class:`LightningCollectives` asks the Trainer's strategy;
  :class:`TorchCollectives` the default ``torch.distributed`` process group (one process when there is none).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import lightning as L
import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch import Tensor, nn

from lit_fgrpo.distributed import global_max, global_sum


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


@runtime_checkable
class Collectives(Protocol):
    """The cross-rank calls of the update; every rank makes the same ones in the same order."""

    @property
    def world_size(self) -> int:
        """Number of ranks (1 in one process)."""
        ...

    def sum(self, value: Tensor) -> Tensor:
        """``value`` summed over ranks (an all-reduce)."""
        ...

    def max(self, value: int) -> int:
        """The largest ``value`` over ranks (an all-reduce)."""
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


class TorchCollectives:
    """:class:`Collectives` of the default ``torch.distributed`` process group (world 1 when none is set up)."""

    @property
    def world_size(self) -> int:
        initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
        return torch.distributed.get_world_size() if initialized else 1

    def sum(self, value: Tensor) -> Tensor:
        return global_sum(value).to(value.dtype)

    def max(self, value: int) -> int:
        return global_max(value)


class LightningCollectives:
    """:class:`Collectives` of a Trainer's strategy (DDP, FSDP, any launcher); world 1 without a Trainer."""

    def __init__(self, trainer: L.Trainer | None) -> None:
        self.trainer = trainer

    @property
    def world_size(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

    def sum(self, value: Tensor) -> Tensor:
        assert self.trainer is not None, "a sum over ranks needs the Trainer's strategy"
        # on the strategy's device: NCCL reduces CUDA tensors only
        summed = self.trainer.strategy.reduce(value.to(self.trainer.strategy.root_device), reduce_op="sum")
        return summed.to(value.device)

    def max(self, value: int) -> int:
        return global_max(value)


def _optimizer_params(optimizer: torch.optim.Optimizer) -> Sequence[nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]
