"""A small maze run that can SIGKILL itself at a chosen moment; run by test_kill_resume.py in a subprocess.

    python -m tests.reliability.kill_run DIR MAX_STEPS KILL [--resume]

KILL is ``none``, ``step:N`` (at the start of the batch after N optimizer steps) or ``write:N`` (half-way through
this process's N-th checkpoint write). With ``--resume`` the run resumes from ``last`` through
:func:`lit_fgrpo.training.checkpointing.resolve_resume`. At the end the policy's weights go to ``DIR/final.pt``.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lit_fgrpo.callbacks import WarmStartCallback
from lit_fgrpo.training.checkpointing import AtomicCheckpointIO, resolve_resume
from tests.training.tiny_setup import maze_data, quiet_trainer, tiny_module, word_count_rollouts


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class KillingCheckpointIO(AtomicCheckpointIO):
    """Atomic writes, except that the ``kill_at``-th write dies half-way through (a SIGKILL mid-write)."""

    def __init__(self, kill_at: int | None) -> None:
        super().__init__()
        self.kill_at, self.writes = kill_at, 0

    def _write(self, checkpoint: dict[str, Any], handle: Any) -> None:
        self.writes += 1
        if self.writes != self.kill_at:
            super()._write(checkpoint, handle)
            return
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        data = buffer.getvalue()
        handle.write(data[: len(data) // 2])
        handle.flush()
        os.fsync(handle.fileno())
        die()


class KillAtStep(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            die()


def main(folder: Path, max_steps: int, kill: str, resume: bool) -> None:
    torch.set_num_threads(1)  # the processes compared must compute alike (see test_kill_resume.launch)
    kind, _, number = kill.partition(":")
    data = maze_data()
    rollout = word_count_rollouts()
    checkpoint = ModelCheckpoint(dirpath=folder / "ckpt", save_last=True, every_n_train_steps=1, save_top_k=0)
    callbacks: list[Callback] = [WarmStartCallback(steps=3, batch_size=8), rollout, checkpoint]
    if kind == "step":
        callbacks.append(KillAtStep(int(number)))
    trainer = quiet_trainer(
        max_steps, callbacks, plugins=[KillingCheckpointIO(int(number) if kind == "write" else None)]
    )
    module = tiny_module(lr=1e-2, gamma=0.5)
    ckpt_path = resolve_resume("last", trainer) if resume else None
    print(f"resuming from {ckpt_path}", flush=True)
    trainer.fit(module, data, ckpt_path=ckpt_path)
    torch.save(module.policy.state_dict(), folder / "final.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], "--resume" in sys.argv)
