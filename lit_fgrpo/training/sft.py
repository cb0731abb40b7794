"""Supervised warm start: teacher-forced cross-entropy on target completions (loss on target tokens only)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from lit_fgrpo.engines.base import Generation, pad_rollouts
from lit_fgrpo.reporting.progress import Mode, progress

log = logging.getLogger(__name__)


def pack_examples(
    examples: Sequence[tuple[list[int], list[int]]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad prompts and right-pad targets into one tensor (the rollout layout of :func:`pad_rollouts`).

    Returns:
        ``input_ids`` (N, L), ``attention_mask`` (N, L) and ``target_mask`` (N, L) that is 1 on target tokens.
    """
    targets = Generation(completion_ids=[t for _, t in examples], finished=[True] * len(examples))
    ids, attn, completion_mask, _ = pad_rollouts([p for p, _ in examples], targets, 1, pad_token_id)
    prompt_part = torch.zeros(len(examples), ids.shape[1] - completion_mask.shape[1], dtype=torch.long)  # (N, Tp)
    return ids, attn, torch.cat([prompt_part, completion_mask.long()], dim=1)


def supervised_warm_start(
    model: nn.Module,
    examples: Sequence[tuple[list[int], list[int]]],
    steps: int,
    pad_token_id: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    schedule: Literal["constant", "cosine"] = "constant",
    seed: int = 0,
    log_every: int = 50,
    on_log: Callable[[int, float], None] | None = None,
    progress_mode: Mode = "auto",
) -> list[float]:
    """Train ``model`` in place for ``steps`` AdamW steps on (prompt ids, target ids) pairs.

    Loss: ``sum_t m_t * CE(logits_{t-1}, y_t) / sum_t m_t`` with m the target mask, so prompts are context only.
    Budgeted by steps, never by seconds (a slow machine must not end with a half-trained policy).
    Progress (``warm start: step 120/600 (20%), loss 1.23, ...``) goes to stdout on rank 0: a bar on a terminal,
    a status line every 10 % or 30 s elsewhere (``progress_mode``, see :mod:`lit_fgrpo.reporting.progress`).

    Returns:
        The loss of every step.
    """
    if steps < 0 or batch_size < 1:
        raise ValueError(f"warm start needs steps >= 0 and batch_size >= 1, got {steps}, {batch_size}")
    if steps == 0:
        return []
    device = next(model.parameters()).device
    ids, attn, target = pack_examples(examples, pad_token_id)  # (N, L) each
    position_ids = (attn.cumsum(dim=1) - 1).clamp(min=0)  # (N, L)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)

    def factor(step: int) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * step / steps)) if schedule == "cosine" else 1.0

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    gen = torch.Generator().manual_seed(seed)
    order, cursor = torch.randperm(len(examples), generator=gen), 0
    was_training = model.training
    model.train()
    losses: list[float] = []
    with progress("warm start", total=steps, mode=progress_mode) as bar:
        for step in range(1, steps + 1):
            if cursor + batch_size > len(order):
                order, cursor = torch.randperm(len(examples), generator=gen), 0
            rows = order[cursor : cursor + batch_size]  # (b,)
            cursor += batch_size
            batch = ids[rows].to(device)  # (b, L)
            # No KV cache: nothing reads it, and under gradient checkpointing transformers would drop it with a
            # warning ("`use_cache=True` is incompatible with gradient checkpointing").
            logits = model(
                input_ids=batch, attention_mask=attn[rows].to(device), position_ids=position_ids[rows].to(device),
                use_cache=False,
            ).logits  # (b, L, V)  # fmt: skip
            token_loss = F.cross_entropy(
                logits[:, :-1].transpose(1, 2).float(), batch[:, 1:], reduction="none"
            )  # (b, L-1)
            weights = target[rows, 1:].to(device).float()  # (b, L-1)
            loss = (token_loss * weights).sum() / weights.sum().clamp(min=1.0)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(float(loss.detach()))
            bar.update(1, loss=losses[-1])
            if step % log_every == 0 or step == steps:
                log.info("warm start step %d/%d loss %.4f", step, steps, losses[-1])
                if on_log is not None:
                    on_log(step, losses[-1])
    model.train(was_training)
    return losses
