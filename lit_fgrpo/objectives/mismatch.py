"""Train/inference mismatch: how far the rollout engine's log-probs are from the trainer's, and the
truncated importance-sampling (TIS) weights that correct for it.

The rollout engine (vLLM, bf16 kernels, a different attention implementation) samples from a policy
``π_engine`` that is close to, but not the same as, the trainer's ``π_old`` at the same weights. The
policy-gradient estimate is unbiased for ``π_old`` only after re-weighting every sampled token by
``π_old / π_engine``. Both the raw ratio and its heavy tail are handled here; the formulas follow TRL's
``vllm_importance_sampling_correction`` (see ``shared/docs/peers.md`` §6.3).

Notation: ``ℓp_old[b, t]`` trainer log-prob of the sampled token (no grad), ``ℓp_eng[b, t]`` the
engine's sampling log-prob of the same token, ``m[b, t] ∈ {0, 1}`` the completion mask.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor


def logprob_mismatch(train_logp: Tensor, engine_logp: Tensor, mask: Tensor) -> Tensor:
    """Mean absolute log-prob gap over the active tokens.

    .. math::
        \\text{mismatch} = \\frac{\\sum_{b,t} |ℓp_{train}[b,t] - ℓp_{eng}[b,t]| \\, m[b,t]}{\\max(\\sum_{b,t} m[b,t], 1)}

    Args:
        train_logp: (B, T) trainer log-probs of the sampled tokens.
        engine_logp: (B, T) engine sampling log-probs of the same tokens.
        mask: (B, T) 1 for completion tokens, 0 for padding (bool or float).

    Returns:
        A scalar tensor (0 when the mask is empty).
    """
    m = mask.to(train_logp.dtype)  # (B, T)
    diff = (train_logp - engine_logp).abs() * m  # (B, T)
    return diff.sum() / m.sum().clamp(min=1.0)


def truncated_importance_weights(
    train_old_logp: Tensor,
    engine_logp: Tensor,
    mask: Tensor,
    level: Literal["token", "sequence"],
    cap: float,
    mode: Literal["truncate", "mask"] = "truncate",
    cap_min: float | None = None,
) -> Tensor:
    """Importance weights ``π_old / π_engine`` for engine-sampled tokens, truncated or masked.

    With ``d[b, t] = (ℓp_old[b, t] - ℓp_eng[b, t]) · m[b, t]``:

    * ``level="token"``: ``ρ[b, t] = exp(d[b, t])``, shape (B, T); inactive positions are set to 0.
    * ``level="sequence"``: ``ρ[b] = exp(Σ_t d[b, t])`` (a *sum*, the sequence likelihood ratio, as in
      TRL), shape (B, 1).

    Then, with ``C_max = cap`` and ``C_min = cap_min`` (no lower bound when ``None``):

    * ``mode="truncate"`` (TIS): ``ρ ← clamp(ρ, C_min, C_max)``.
    * ``mode="mask"`` (IcePop / seq-mask-TIS): ``ρ ← ρ · 1[C_min ≤ ρ ≤ C_max]``, i.e. outliers get
      weight 0 instead of being clipped.

    The result carries no gradient (it is computed from detached inputs).

    Args:
        train_old_logp: (B, T) log-probs of the sampled tokens under the trainer's behaviour policy.
        engine_logp: (B, T) the engine's sampling log-probs of the same tokens.
        mask: (B, T) 1 for completion tokens, 0 for padding.
        level: ``"token"`` for per-token weights, ``"sequence"`` for one weight per row.
        cap: upper bound ``C_max`` (> 0).
        mode: ``"truncate"`` to clamp, ``"mask"`` to zero out weights outside the bounds.
        cap_min: optional lower bound ``C_min``.

    Returns:
        (B, T) for ``level="token"``, (B, 1) for ``level="sequence"``.
    """
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    if cap_min is not None and cap_min > cap:
        raise ValueError(f"cap_min ({cap_min}) must be <= cap ({cap})")
    m = mask.to(train_old_logp.dtype)  # (B, T)
    d = (train_old_logp.detach() - engine_logp.detach()) * m  # (B, T)
    if level == "token":
        rho = torch.exp(d)  # (B, T)
    elif level == "sequence":
        rho = torch.exp(d.sum(dim=-1, keepdim=True))  # (B, 1)
    else:
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")

    if mode == "truncate":
        rho = rho.clamp(min=cap_min, max=cap)
    elif mode == "mask":
        keep = rho <= cap  # (B, T) or (B, 1)
        if cap_min is not None:
            keep = keep & (rho >= cap_min)
        rho = torch.where(keep, rho, torch.zeros_like(rho))
    else:
        raise ValueError(f"mode must be 'truncate' or 'mask', got {mode!r}")

    if level == "token":
        rho = rho * m  # (B, T)
    return rho
