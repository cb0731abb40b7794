"""A run resumed at its end still ends: the final validation that the killed process did not reach, run once.

Lightning restores a checkpoint taken at ``max_steps`` and then skips the fit loop (``FitLoop.skip``), so the
validation that the training loop runs after its last batch never happens: no ``val/*`` at the last step, so no
``final/*``, no figure. The checkpoint was taken in ``on_train_batch_end``, before that validation, so whether it
was due is the same decision the loop would have taken then (:func:`final_validation_due`), and the validation is the
loop's own (:func:`run_final_validation`). Used by :class:`~lit_fgrpo.callbacks.PassAtKReport` in ``on_fit_end``.
"""

from __future__ import annotations

from typing import Any


def resumed_at_end(trainer: Any) -> bool:
    """Whether this ``fit`` restored a checkpoint at or past ``max_steps`` (the loop ran no step)."""
    max_steps = getattr(trainer, "max_steps", -1)
    return trainer.ckpt_path is not None and max_steps is not None and 0 <= max_steps <= trainer.global_step


def final_validation_due(trainer: Any) -> bool:
    """Whether the training loop validates after the checkpoint's batch (its own rule, on the restored progress)."""
    loop = trainer.fit_loop.epoch_loop
    try:
        return bool(loop._should_check_val_fx(None))
    except Exception:  # a Lightning without that private rule: validate when validation is on at all
        return bool(trainer.enable_validation)


def run_final_validation(trainer: Any) -> None:
    """Run the fit's validation loop once, the way the training loop runs it after a batch."""
    connector = trainer._logger_connector
    first_loop_iter = connector._first_loop_iter
    trainer.validating = True  # selects the validation loop as the active one
    try:
        trainer.fit_loop.epoch_loop.val_loop.run()
    finally:
        trainer.training = True
        connector._first_loop_iter = first_loop_iter
