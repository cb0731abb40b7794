"""The decoupled objective of asynchronous RL is policy_loss + truncated_importance_weights, checked against AReaL.

AReaL's decoupled PPO loss (``ppo_actor_loss_fn``, arXiv 2505.24298 §5), per token with ``π`` current, ``π_prox``
the trainer's recomputed policy at the start of the step and ``π_behav`` the (stale) sampling policy:

.. math::
    ℓ = -\\min(r A, \\operatorname{clip}(r, 1-ε, 1+ε) A) · w, \\quad r = π / π_{prox}, \\quad
    w = π_{prox} / π_{behav} · 1[π_{prox} / π_{behav} \\le C]

averaged over the active tokens. lit_fgrpo writes it as ``policy_loss(logp, old_logp=prox, ..., "bnpo",
importance_weights=truncated_importance_weights(prox, behav, mask, "token", C, mode="mask"))``; ``mode="truncate"``
gives the TIS variant ``w = min(π_prox / π_behav, C)`` (verl / TRL), which is what FGRPOModule uses today with
``importance_correction="token"``.
"""

from __future__ import annotations

import pytest
import torch

from lit_fgrpo.objectives.loss_types import policy_loss
from lit_fgrpo.objectives.mismatch import truncated_importance_weights


def areal_decoupled_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    loss_mask: torch.Tensor,
    behav_imp_weight_cap: float,
    truncate: bool = False,
) -> torch.Tensor:
    """AReaL's formula, written out with its own names (advantages per token); ``truncate`` swaps its mask for TIS."""
    loss_mask_count = loss_mask.count_nonzero() or 1
    ratio = torch.where(loss_mask, torch.exp(logprobs - proximal_logprobs), 0)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * clipped_ratio
    pg_loss = torch.max(pg_loss1, pg_loss2)
    behav_kl = proximal_logprobs - old_logprobs
    behav_imp_weight = behav_kl.exp()
    if truncate:
        behav_imp_weight = torch.where(loss_mask, behav_imp_weight.clamp(max=behav_imp_weight_cap), 0.0)
    else:
        behav_mask = (behav_imp_weight <= behav_imp_weight_cap).logical_and(loss_mask)
        behav_imp_weight = torch.where(behav_mask, behav_imp_weight, 0.0)
    pg_loss = pg_loss * behav_imp_weight
    return torch.where(loss_mask, pg_loss, 0.0).sum() / loss_mask_count


def rollout(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 9
    behaviour = -torch.rand(B, T, generator=g) * 3  # (B, T) stale sampling policy
    proximal = behaviour + torch.randn(B, T, generator=g) * 0.6  # (B, T) k versions later
    current = proximal + torch.randn(B, T, generator=g) * 0.3  # (B, T) after some updates
    lengths = torch.tensor([9, 4, 1, 7, 0, 5])
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    advantages = torch.randn(B, generator=g)  # (B,)
    return current, proximal, behaviour, mask, advantages


@pytest.mark.parametrize("mode", ["mask", "truncate"])
def test_decoupled_loss_and_gradient_match_areal(mode: str) -> None:
    current, proximal, behaviour, mask, advantages = rollout()
    cap, eps = 2.0, 0.2
    mine_logp = current.clone().requires_grad_(True)
    weights = truncated_importance_weights(proximal, behaviour, mask, "token", cap, mode=mode)  # type: ignore[arg-type]
    loss, _ = policy_loss(mine_logp, proximal, advantages, mask.float(), "bnpo", eps, eps, importance_weights=weights)
    ref_logp = current.clone().requires_grad_(True)
    per_token_adv = advantages[:, None].expand_as(current)  # (B, T)
    ref = areal_decoupled_loss(
        ref_logp, proximal, behaviour, per_token_adv, eps, mask, cap, truncate=mode == "truncate"
    )
    binds = (weights == 0) if mode == "mask" else (weights == cap)  # (B, T)
    assert binds.logical_and(mask).any()  # the cap is hit somewhere, so the test tells mask from truncate
    torch.testing.assert_close(loss, ref)
    loss.backward()
    ref.backward()
    assert mine_logp.grad is not None and ref_logp.grad is not None
    torch.testing.assert_close(mine_logp.grad, ref_logp.grad)


def test_weights_use_the_proximal_not_the_current_policy() -> None:
    """Swapping proximal for current in the weights changes the loss: the test would catch that slip."""
    current, proximal, behaviour, mask, advantages = rollout(1)
    right = truncated_importance_weights(proximal, behaviour, mask, "token", 2.0, mode="mask")
    wrong = truncated_importance_weights(current, behaviour, mask, "token", 2.0, mode="mask")
    a, _ = policy_loss(current, proximal, advantages, mask.float(), "bnpo", importance_weights=right)
    b, _ = policy_loss(current, proximal, advantages, mask.float(), "bnpo", importance_weights=wrong)
    ref = areal_decoupled_loss(current, proximal, behaviour, advantages[:, None].expand_as(current), 0.2, mask, 2.0)
    torch.testing.assert_close(a, ref)
    assert not torch.allclose(b, ref)
