"""Supervised warm start on chat transcripts: teacher-forced cross-entropy on the assistant's tokens, as episodes.

The rows are :class:`~lit_fgrpo.environments.transcripts.TranscriptTokens` (an episode's layout: prompt, assistant
turns, environment turns), so the warm start trains the very tokens RL will sample. The loss of a step is

    L = - sum_{rows, t} m_t log p(y_t | y_<t) / sum_{rows, t} m_t         (m: 1 on assistant tokens)

over the step's ``batch_size`` transcripts, whatever the ranks and micro-batches: each rank scores its share
(:mod:`~lit_fgrpo.training.conversation_batches`), divides by the step's token count (known to every rank), and the
gradients are summed over the ranks, so two ranks give one rank's update. LoRA or full: whatever parameters require a
gradient are trained (AdamW, gradient clip, constant or cosine rate after a linear warm-up).

The held-out loss (the same mean, on ``held_out`` transcripts left out of training) is measured before the first step,
every ``eval_every`` steps and after the last. Budgeted by steps, never seconds. Resumable from its state file
(:mod:`~lit_fgrpo.training.conversation_sft_state`): a killed warm start goes on from its last saved step, and a
finished one is loaded instead of run again.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lit_fgrpo.distributed.collectives import global_sum, is_distributed
from lit_fgrpo.environments.transcripts import TranscriptTokens
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.models.logprobs import completion_logprobs, eval_mode, train_mode
from lit_fgrpo.reporting.progress import Mode, progress
from lit_fgrpo.training.conversation_batches import micro_batches, pack_rows, rank_share, step_rows
from lit_fgrpo.training.conversation_sft_state import (
    fingerprint,
    load_state,
    restore_weights,
    save_state,
    training_state,
)

log = logging.getLogger(__name__)

FLAG = "ConversationWarmStart"
"""The settings' owner in messages (the callback that runs the warm start in ``fit``)."""


@dataclass(frozen=True)
class ConversationSFTSettings:
    """How the conversation warm start trains (``trainer.callbacks: ConversationWarmStart``'s arguments)."""

    steps: int = 100
    """Optimizer steps (0: no warm start)."""
    batch_size: int = 16
    """Transcripts per step, over all ranks."""
    micro_batch_rows: int = 8
    """Transcripts per forward and backward on one rank (bounds the memory; not the result)."""
    micro_batch_tokens: int | None = None
    """At most this many padded tokens per forward and backward as well, rows x the longest of them (a longer
    transcript goes alone); None: rows only. Not the result either."""
    lr: float = 2e-4
    """AdamW's peak learning rate."""
    weight_decay: float = 0.0
    """AdamW's weight decay."""
    schedule: Literal["constant", "cosine"] = "cosine"
    """The rate after the warm-up: constant, or cosine decay to zero at the last step."""
    warmup_steps: int = 0
    """Linear warm-up of the rate, in steps."""
    max_grad_norm: float = 1.0
    """Gradient clip (global L2 norm)."""
    seed: int = 0
    """Seed of the transcripts' order and of the held-out draw."""
    held_out: int = 32
    """Transcripts kept out of training for the held-out loss (0: none)."""
    eval_every: int = 0
    """Held-out loss every this many steps (0: before the first and after the last only)."""
    log_every: int = 10
    """Log the loss every this many steps (and after the last)."""
    checkpoint_every: int = 50
    """Save the resumable state every this many steps (0: only when done)."""

    def __post_init__(self) -> None:
        for name in ("steps", "held_out", "eval_every", "warmup_steps", "checkpoint_every", "seed"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{FLAG}.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("batch_size", "micro_batch_rows", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{FLAG}.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("lr", "max_grad_norm"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ConfigError(f"{FLAG}.{name} must be finite and > 0, got {getattr(self, name)}")
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 1:
            raise ConfigError(f"{FLAG}.micro_batch_tokens must be >= 1 or null, got {self.micro_batch_tokens}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(f"{FLAG}.weight_decay must be finite and >= 0, got {self.weight_decay}")
        if self.schedule not in ("constant", "cosine"):
            raise ConfigError(f"{FLAG}.schedule must be 'constant' or 'cosine', got {self.schedule!r}")

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass
class SFTResult:
    """What a warm start did."""

    losses: list[float] = field(default_factory=list)
    """The training loss of every step (those before a resume included)."""
    held_out_losses: dict[int, float] = field(default_factory=dict)
    """Step -> held-out loss (step 0: before training)."""
    resumed_from: int = 0
    """The step a saved state was resumed from (``steps``: a finished warm start was loaded, nothing trained)."""


def rate_factor(step: int, settings: ConversationSFTSettings) -> float:
    """The learning rate's factor at 0-based step ``step``: linear warm-up, then constant or cosine to zero."""
    if step < settings.warmup_steps:
        return (step + 1) / (settings.warmup_steps + 1)
    if settings.schedule == "constant":
        return 1.0
    span = max(settings.steps - settings.warmup_steps, 1)
    return 0.5 * (1.0 + math.cos(math.pi * (step - settings.warmup_steps) / span))


def _rank() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if is_distributed() else (0, 1)


def token_loss_sum(policy: nn.Module, rows: Sequence[TranscriptTokens], pad_token_id: int) -> Tensor:
    """``- sum m_t log p(y_t | y_<t)`` over the rows' assistant tokens (a scalar with the policy's graph)."""
    device = next(policy.parameters()).device
    input_ids, attention, loss_mask, T = pack_rows(rows, pad_token_id)  # (b, S + T), (b, S + T), (b, T)
    logp = completion_logprobs(
        policy, input_ids.to(device), attention.to(device), T, chunk_rows=len(rows)
    ).logp  # (b, T)
    return -(logp * loss_mask.to(device)).sum()


def held_out_loss(
    policy: nn.Module,
    rows: Sequence[TranscriptTokens],
    pad_token_id: int,
    micro_batch_rows: int,
    micro_batch_tokens: int | None = None,
) -> float:
    """The mean assistant-token loss over ``rows`` (each rank scores its share; NaN without rows)."""
    rank, world = _rank()
    mine = rank_share(range(len(rows)), rank, world)
    total = torch.zeros((), dtype=torch.float64)
    with torch.no_grad(), eval_mode(policy):
        for chunk in micro_batches(mine, micro_batch_rows, [len(rows[i].ids) for i in mine], micro_batch_tokens):
            total += float(token_loss_sum(policy, [rows[i] for i in chunk], pad_token_id))
    tokens = sum(row.trained_tokens for row in rows)
    return float(global_sum(total)) / tokens if tokens else float("nan")


def _sum_gradients(params: Sequence[nn.Parameter]) -> None:
    """Sum every parameter's gradient over the ranks (each rank's already divided by the step's token count)."""
    if not is_distributed():
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def _train_step(
    policy: nn.Module,
    train: Sequence[TranscriptTokens],
    step: int,
    settings: ConversationSFTSettings,
    pad_token_id: int,
    params: Sequence[nn.Parameter],
) -> float:
    """Gradients of one step's loss on this rank's share, summed over ranks; returns the step's (global) loss."""
    rows = step_rows(step, settings.batch_size, len(train), settings.seed)
    tokens = sum(train[i].trained_tokens for i in rows)  # the step's, every rank's: the divisor
    rank, world = _rank()
    total = torch.zeros((), dtype=torch.float64)
    mine = rank_share(rows, rank, world)
    lengths = [len(train[i].ids) for i in mine]
    for chunk in micro_batches(mine, settings.micro_batch_rows, lengths, settings.micro_batch_tokens):
        loss = token_loss_sum(policy, [train[i] for i in chunk], pad_token_id)
        (loss / tokens).backward()
        total += float(loss.detach())
    _sum_gradients(params)
    return float(global_sum(total)) / tokens


def conversation_warm_start(
    policy: nn.Module,
    train: Sequence[TranscriptTokens],
    held_out: Sequence[TranscriptTokens],
    settings: ConversationSFTSettings,
    pad_token_id: int,
    state_dir: str | Path | None = None,
    on_log: Callable[[int, dict[str, float]], None] | None = None,
    progress_mode: Mode = "auto",
) -> SFTResult:
    """Train ``policy`` in place on the transcripts' assistant tokens for ``settings.steps`` steps.

    Every rank of an initialised process group calls it with the same transcripts and settings.

    Args:
        policy: A causal LM (PEFT-wrapped or not); the parameters that require a gradient are trained.
        train: The training transcripts.
        held_out: Transcripts for the held-out loss only.
        settings: Steps, batch, rate, cadence.
        pad_token_id: Pads the rows (never scored).
        state_dir: Where the resumable state lives (``None``: not saved, never resumed).
        on_log: Called as ``on_log(step, {"loss": ..., "held_out_loss": ...})`` at the logging steps (1-based;
            step 0 carries the held-out loss before training).
        progress_mode: The progress bar (:mod:`lit_fgrpo.reporting.progress`).

    Returns:
        The losses, the held-out losses and the step it resumed from.
    """
    result = SFTResult()
    if settings.steps == 0:
        return result
    if not train:
        raise ConfigError(f"{FLAG}: no training transcripts (all {len(held_out)} are held out)")
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=settings.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: rate_factor(s, settings))
    key = fingerprint(settings, train, held_out)
    saved = load_state(state_dir, key)
    if saved is not None:
        restore_weights(policy, saved["weights"])
        result.losses, result.held_out_losses = list(saved["losses"]), dict(saved["held_out_losses"])
        result.resumed_from = int(saved["step"])
        if result.resumed_from >= settings.steps:
            log.info("warm start: done earlier, loaded from %s", state_dir)
            return result
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["rng"])
    rank, _ = _rank()

    def report(step: int, values: dict[str, float]) -> None:
        if on_log is not None:
            on_log(step, values)

    def evaluate(step: int) -> float:
        value = held_out_loss(policy, held_out, pad_token_id, settings.micro_batch_rows, settings.micro_batch_tokens)
        result.held_out_losses[step] = value
        return value

    def checkpoint(step: int, final: bool) -> None:
        if state_dir is not None and rank == 0:
            state = training_state(
                step, policy, None if final else optimizer, None if final else scheduler,
                result.losses, result.held_out_losses, key,
            )  # fmt: skip
            save_state(state_dir, state)

    if held_out and result.resumed_from == 0:
        report(0, {"held_out_loss": evaluate(0)})
    start = result.resumed_from
    title = "warm start (conversations)" + (f", resumed at step {start}" if start else "")
    with train_mode(policy), progress(title, total=settings.steps - start, mode=progress_mode) as bar:
        for step in range(start + 1, settings.steps + 1):
            optimizer.zero_grad(set_to_none=True)
            loss = _train_step(policy, train, step - 1, settings, pad_token_id, params)
            torch.nn.utils.clip_grad_norm_(params, settings.max_grad_norm)
            optimizer.step()
            scheduler.step()
            result.losses.append(loss)
            values = {"loss": loss}
            last = step == settings.steps
            if held_out and (last or (settings.eval_every and step % settings.eval_every == 0)):
                values["held_out_loss"] = evaluate(step)
            bar.update(1, **values)
            if last or step % settings.log_every == 0 or "held_out_loss" in values:
                log.info("warm start step %d/%d %s", step, settings.steps, values)
                report(step, values)
            if not last and settings.checkpoint_every and step % settings.checkpoint_every == 0:
                checkpoint(step, final=False)
    checkpoint(settings.steps, final=True)
    return result


__all__ = ["ConversationSFTSettings", "SFTResult", "conversation_warm_start", "held_out_loss", "rate_factor"]
