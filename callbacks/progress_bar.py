"""``RLProgressBar``: the Trainer's bar counts RL steps out of ``max_steps`` and shows reward and pass@1.

Lightning's ``TQDMProgressBar`` counts batches of an epoch; an RL run streams prompts for ``max_steps`` optimizer
steps in one endless epoch, so it read ``Epoch 0/-2`` with no total. This one shows ``RL: 120/200 [reward=0.41,
pass@1=0.23]`` on a terminal and, elsewhere (CI logs), a status line every 10 % or 30 s (:mod:`lit_fgrpo.reporting.progress`):
``RL: step 120/200 (60%), reward 0.41, pass@1 0.23, 04:01 elapsed, ~02:41 left``.

Each validation (the held-out pass@k sampled in Lightning's validation loop) shows Lightning's validation bar on a
terminal and, elsewhere, status lines of its own: ``pass@k at step 200: batch 4/4 (100%), 01:02 elapsed``. The
pass@k before RL is sampled outside the loop and reports through :func:`lit_fgrpo.reporting.progress.progress`.

The CLI installs it unless the config has a progress bar of its own or ``trainer.enable_progress_bar: false``
(:func:`default_progress_bar`).
"""

from __future__ import annotations

import importlib
import math
import sys
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import _update_n
from typing_extensions import override

from lit_fgrpo.reporting.progress import Mode, ProgressReporter, resolve_mode

# Progress-bar metric names as the module logs them -> the short label shown.
LABELS = {"reward": "reward", "val/pass_at_1": "pass@1"}


class RLProgressBar(TQDMProgressBar):
    """Steps out of ``max_steps`` with the latest reward and held-out pass@1.

    Args:
        refresh_rate: redraw the terminal bar every this many batches.
        leave: keep the finished bar on screen.
        mode: ``auto`` (bar on a terminal, status lines elsewhere), ``bar``, ``lines`` or ``off``.
        every_s: in line mode, print at least this often (seconds).
    """

    def __init__(self, refresh_rate: int = 1, leave: bool = False, mode: Mode = "auto", every_s: float = 30.0) -> None:
        if refresh_rate < 0 or not every_s > 0:
            raise ValueError(f"RLProgressBar needs refresh_rate >= 0 and every_s > 0, got {refresh_rate}, {every_s}")
        super().__init__(refresh_rate=refresh_rate, leave=leave)
        self.mode, self.every_s = mode, every_s
        self._lines: ProgressReporter | None = None
        self._val_lines: ProgressReporter | None = None

    @property
    def line_mode(self) -> bool:
        return resolve_mode(self.mode, sys.stdout) != "bar"

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if self.line_mode:
            self.disable()  # no tqdm frames in a log; the status lines of on_train_batch_end replace them

    @override
    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return {LABELS.get(name, name): value for name, value in metrics.items()}

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        super().on_train_epoch_start(trainer)
        total = trainer.max_steps if trainer.max_steps > 0 else None
        bar = self.train_progress_bar
        bar.reset(total=total)
        bar.initial = trainer.global_step  # a resumed run starts where it stopped
        bar.set_description("RL")
        if self.line_mode and trainer.is_global_zero and self._lines is None:
            self._lines = ProgressReporter("RL", total, mode=self.mode, every_s=self.every_s)
            self._lines.done = trainer.global_step

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step  # optimizer steps: a batch may take several (mini-batches)
        if self._lines is not None:
            numbers = {k: float(v) for k, v in self.get_metrics(trainer, pl_module).items() if _is_number(v)}
            self._lines.update(step - self._lines.done, **numbers)
        elif self._should_update(step, self.train_progress_bar.total or 0):
            _update_n(self.train_progress_bar, step)
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    @override
    def on_train_end(self, *args: Any) -> None:
        super().on_train_end(*args)
        if self._lines is not None:
            self._lines.close()
            self._lines = None

    @override
    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        super().on_validation_batch_start(trainer, pl_module, batch, batch_idx, dataloader_idx)
        # the number of batches is known from the first batch on (not yet at on_validation_start)
        if self._val_lines is None and self.line_mode and trainer.is_global_zero and not trainer.sanity_checking:
            # not self.total_val_batches: that reads 0 when validation runs by step (check_val_every_n_epoch None)
            counts = [float(n) for n in trainer.num_val_batches]
            total = int(sum(counts)) if counts and all(math.isfinite(n) for n in counts) else None
            label = f"pass@k at step {trainer.global_step}"
            self._val_lines = ProgressReporter(label, total, unit="batch", mode=self.mode, every_s=self.every_s)

    @override
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)
        if self._val_lines is not None:
            self._val_lines.update(1)

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if self._val_lines is not None:
            self._val_lines.close()
            self._val_lines = None


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _is_progress_bar(class_path: str) -> bool:
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, ProgressBar)


def default_progress_bar(trainer_config: Any) -> list[L.Callback]:
    """``[RLProgressBar()]`` unless the Trainer config disables the bar or brings its own.

    Args:
        trainer_config: the parsed ``trainer`` section (a jsonargparse Namespace or a dict).
    """
    get = trainer_config.get if hasattr(trainer_config, "get") else lambda key, default=None: default
    if get("enable_progress_bar", True) is False:
        return []
    for callback in get("callbacks", None) or []:
        if isinstance(callback, ProgressBar) or _is_progress_bar(str(getattr(callback, "class_path", ""))):
            return []
    return [RLProgressBar()]
