"""Per-token KL estimators between the policy and a reference model."""

from __future__ import annotations

import torch
from torch import Tensor


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(pi_theta || pi_ref), per token.

    With delta = log pi_ref(y_t) - log pi_theta(y_t):  ``kl_t = exp(delta) - delta - 1 >= 0``.
    It is unbiased under samples from pi_theta and is exactly 0 where the two log-probs agree.

    Args:
        logp: (B, T) policy log-probs of the sampled tokens.
        ref_logp: (B, T) reference log-probs of the same tokens.

    Returns:
        (B, T) per-token KL estimates (no clamping; TRL does none either).
    """
    if logp.shape != ref_logp.shape:
        raise ValueError(f"kl_k3: logp shape {tuple(logp.shape)} != ref_logp shape {tuple(ref_logp.shape)}")
    delta = ref_logp - logp  # (B, T)
    return torch.exp(delta) - delta - 1.0
