"""Per-token log-probs of completions under a causal LM, without a full-vocabulary fp32 log-softmax.

For each completion token y_t the log-prob is ``logit[y_t] / tau - logsumexp(logits / tau)``: a gather plus a
logsumexp per position, computed on chunks of rows so that at most ``chunk_rows * T * V`` logits are upcast to
float32 at a time. The model is asked only for the last T + 1 positions (``logits_to_keep``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class TokenLogprobs:
    """Log-probs (and optionally entropies) of completion tokens."""

    logp: Tensor
    """(B, T) log pi(y_t | x, y_<t) at the sampling temperature."""
    entropy: Tensor | None = None
    """(B, T) entropy of the next-token distribution, detached; None when not requested."""


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    forward = getattr(model, "forward", None)
    try:
        return forward is not None and "logits_to_keep" in inspect.signature(forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - exotic wrappers
        return False


def selective_log_softmax(logits: Tensor, token_ids: Tensor) -> Tensor:
    """``log_softmax(logits)[token_ids]`` per position, via gather and logsumexp in float32.

    Args:
        logits: (b, T, V) logits (any float dtype).
        token_ids: (b, T) token ids to pick.

    Returns:
        (b, T) float32 log-probs.
    """
    logits = logits.float()
    picked = torch.gather(logits, dim=-1, index=token_ids.unsqueeze(-1)).squeeze(-1)  # (b, T)
    return picked - torch.logsumexp(logits, dim=-1)  # (b, T)


def completion_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_length: int,
    temperature: float = 1.0,
    chunk_rows: int = 64,
    with_entropy: bool = False,
) -> TokenLogprobs:
    """Log-probs of the last ``completion_length`` tokens of each row.

    Args:
        model: a Hugging Face causal LM (or anything returning ``.logits`` of shape (b, L, V)).
        input_ids: (B, L) prompt (left-padded) followed by the completion (right-padded), L = Tp + T.
        attention_mask: (B, L) 1 on real tokens.
        completion_length: T, the number of trailing positions that are completion tokens.
        temperature: logits are divided by it, as at sampling time.
        chunk_rows: rows per forward pass; bounds the (rows, T, V) float32 buffer.
        with_entropy: also return the per-token entropy (detached).

    Returns:
        :class:`TokenLogprobs` with (B, T) tensors.
    """
    T = completion_length
    keep = _accepts_logits_to_keep(model)
    # Position ids from the attention mask, so that left padding does not shift RoPE positions.
    position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, L)
    logps, entropies = [], []
    for start in range(0, input_ids.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        kwargs = {"logits_to_keep": T + 1} if keep else {}
        out = model(
            input_ids=input_ids[rows], attention_mask=attention_mask[rows], position_ids=position_ids[rows], **kwargs
        )
        logits = out.logits[:, -(T + 1) : -1, :]  # (b, T, V): position t predicts token t + 1
        if temperature != 1.0:
            logits = logits / temperature
        targets = input_ids[rows, -T:]  # (b, T)
        logps.append(selective_log_softmax(logits, targets))
        if with_entropy:
            with torch.no_grad():
                logz = torch.logsumexp(logits.float(), dim=-1, keepdim=True)  # (b, T, 1)
                probs = torch.exp(logits.float() - logz)  # (b, T, V)
                entropies.append(logz.squeeze(-1) - (probs * logits.float()).sum(-1))  # (b, T)
    return TokenLogprobs(torch.cat(logps), torch.cat(entropies) if with_entropy else None)
