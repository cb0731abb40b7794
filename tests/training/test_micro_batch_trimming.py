"""Sorted, padding-trimmed micro-batches change no gradient (the micro-batch equality test, with ragged prompts).

The module sorts rows by completion length and cuts each micro-batch to its longest prompt and completion; the
reference is :func:`policy_loss` on the whole untrimmed batch in row order, through the plain log-prob path.
A forward hook checks that the trimming really happens (narrower inputs than the padded batch).
"""

from __future__ import annotations

import copy

import pytest
import torch

from lit_fgrpo.models.logprobs import completion_logprobs
from lit_fgrpo.objectives import group_advantages, policy_loss
from lit_fgrpo.rollout.batch import RolloutBatch
from tests.training.tiny_setup import synthetic_rollout, tiny_module


def ragged_rollout() -> RolloutBatch:
    """The synthetic rollout with left-padded prompts of 2..6 tokens (position ids then differ per row)."""
    rollout = synthetic_rollout(P=4, G=4, Tp=6, T=7, seed=3)
    B = rollout.input_ids.shape[0]
    prompt_len = 2 + torch.arange(B) % 5  # (B,)
    pad = torch.arange(6)[None, :] < (6 - prompt_len)[:, None]  # (B, Tp) leading padding
    rollout.attention_mask[:, :6][pad] = 0
    rollout.input_ids[:, :6][pad] = 0
    rollout.sampling_logp = -torch.rand(rollout.completion_mask.shape) * rollout.completion_mask  # (B, T)
    return rollout


@pytest.mark.parametrize(
    ("loss_type", "settings"),
    [
        ("grpo", {}),
        ("dr_grpo", {}),
        ("dapo", {}),
        ("bnpo", {"beta": 0.1}),
        ("cispo", {"importance_correction": "token"}),
        ("grpo", {"importance_correction": "sequence"}),
    ],
)
def test_sorted_trimmed_micro_batches_give_the_whole_batch_gradient(loss_type: str, settings: dict) -> None:
    rollout = ragged_rollout()
    module = tiny_module(gamma=0.5, loss_type=loss_type, micro_batch_rows=3, max_grad_norm=None, **settings)
    reference = copy.deepcopy(module.policy)
    adv = group_advantages(rollout.rewards, 0.5, success=rollout.correct).reshape(-1)  # (B,)
    logp = completion_logprobs(reference, rollout.input_ids, rollout.attention_mask, 7, chunked=False).logp  # (B, T)
    ref_logp = None
    if settings.get("beta"):
        with torch.no_grad():
            ref_logp = completion_logprobs(module.reference, rollout.input_ids, rollout.attention_mask, 7).logp
    weights = None
    if "importance_correction" in settings:
        from lit_fgrpo.objectives.mismatch import truncated_importance_weights

        assert rollout.sampling_logp is not None
        weights = truncated_importance_weights(
            logp.detach(), rollout.sampling_logp, rollout.completion_mask, settings["importance_correction"], 3.0
        )
    loss, _ = policy_loss(
        logp, None, adv, rollout.completion_mask, "dapo" if loss_type == "bnpo" else loss_type,  # type: ignore[arg-type]
        module.epsilon, module.epsilon_high, ref_logp, settings.get("beta", 0.0), max_completion_length=7,
        num_items=rollout.completion_mask.sum(), importance_weights=weights,
    )  # fmt: skip
    loss.backward()

    widths: list[int] = []
    hook = module.policy.get_input_embeddings().register_forward_hook(lambda m, i, o: widths.append(i[0].shape[1]))
    pieces = module.backward_on(rollout)
    hook.remove()
    assert len(pieces) == 6  # 16 rows in micro-batches of 3
    assert min(widths) < rollout.input_ids.shape[1]  # padding was trimmed
    for (name, p), (_, q) in zip(module.policy.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=f"{loss_type} {name}")

    # A token budget (at most 30 padded tokens a forward, at most 8 rows) cuts differently: the same gradient.
    budgeted = tiny_module(
        gamma=0.5, loss_type=loss_type, micro_batch_rows=8, micro_batch_tokens=30, max_grad_norm=None, **settings
    )
    budgeted.policy.load_state_dict(reference.state_dict())
    shapes: list[tuple[int, int]] = []
    hook = budgeted.policy.get_input_embeddings().register_forward_hook(lambda m, i, o: shapes.append(i[0].shape))
    budgeted.backward_on(rollout)
    hook.remove()
    assert len(shapes) > 2 and len({s[0] for s in shapes}) > 1  # micro-batches of several sizes
    assert all(b * w <= 30 or b == 1 for b, w in shapes)
    for (name, p), (_, q) in zip(budgeted.policy.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=f"{loss_type} {name} (token budget)")
