"""policy_loss against a naive per-token formula, gradient checks, and TRL 1.16 parity."""

from __future__ import annotations

import importlib.util
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from lit_fgrpo.objectives import group_advantages, kl_k3, policy_loss

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo"]


def make_inputs(seed: int = 0, B: int = 6, T: int = 7):
    gen = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=gen, dtype=torch.float64) * 3).requires_grad_(True)
    # old log-probs spread so that ratios fall inside and outside [0.8, 1.2]
    old = (logp.detach() + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3).detach()
    ref = (logp.detach() + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.2).detach()
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    mask[0] = 0.0  # one empty row
    return logp, old, ref, adv, mask


def naive_loss(logp, old, ref, adv, mask, loss_type, eps, eps_high, beta, lmax, num_items):
    B, T = logp.shape
    rows, total, count = [], 0.0, 0.0
    for b in range(B):
        row_sum, row_n = 0.0, 0.0
        for t in range(T):
            if mask[b, t] == 0:
                continue
            w = torch.exp(logp[b, t] - old[b, t])
            wc = torch.clamp(w, 1 - eps, 1 + eps_high)
            if loss_type == "cispo":
                term = -wc.detach() * adv[b] * logp[b, t]
            else:
                term = -torch.min(w * adv[b], wc * adv[b])
            if beta > 0:
                d = ref[b, t] - logp[b, t]
                term = term + beta * (torch.exp(d) - d - 1)
            row_sum, row_n = row_sum + term, row_n + 1
        rows.append(row_sum / max(row_n, 1.0))
        total, count = total + row_sum, count + row_n
    if loss_type == "grpo":
        return sum(rows) / B
    if loss_type == "bnpo":
        return total / max(count, 1.0)
    if loss_type == "dr_grpo":
        return total / (B * lmax)
    return total / max(num_items if num_items is not None else count, 1.0)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("eps_high", [None, 0.28])
def test_value_and_gradient_match_naive(loss_type: str, beta: float, eps_high: float | None) -> None:
    logp, old, ref, adv, mask = make_inputs()
    eps = 1.0 if loss_type == "cispo" else 0.2
    hi = (5.0 if eps_high else 0.5) if loss_type == "cispo" else eps_high
    num_items = 40.0 if loss_type in ("dapo", "cispo") else None
    loss, stats = policy_loss(
        logp, old, adv, mask, loss_type, eps, hi, ref, beta, max_completion_length=9, num_items=num_items
    )
    (grad,) = torch.autograd.grad(loss, logp)
    want = naive_loss(logp, old, ref, adv, mask, loss_type, eps, hi if hi is not None else eps, beta, 9, num_items)
    (want_grad,) = torch.autograd.grad(want, logp)
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(grad, want_grad)
    assert set(stats) >= {"clip_frac_low", "clip_frac_high", "clip_frac", "ratio_mean", "kl"}


def naive_gspo(logp, old, ref, adv, mask, eps, eps_high, beta):
    """GSPO (arXiv 2507.18071, eq. 5-7) per sequence: s_b = exp(mean_t log-ratio), clipped per sequence."""
    B, T = logp.shape
    rows = []
    for b in range(B):
        toks = [t for t in range(T) if mask[b, t] != 0]
        n = max(len(toks), 1)
        s = torch.exp(sum((logp[b, t] - old[b, t] for t in toks), torch.zeros((), dtype=logp.dtype)) / n)
        seq_term = -torch.min(s * adv[b], torch.clamp(s, 1 - eps, 1 + eps_high) * adv[b])
        row = torch.zeros((), dtype=logp.dtype)
        for t in toks:
            d = ref[b, t] - logp[b, t]
            row = row + seq_term + (beta * (torch.exp(d) - d - 1) if beta > 0 else 0.0)
        rows.append(row / n)
    return sum(rows) / B


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize(("eps", "eps_high"), [(0.2, 0.28), (3e-4, 4e-4), (0.05, None)])
def test_gspo_value_and_gradient_match_naive(beta: float, eps: float, eps_high: float | None) -> None:
    logp, old, ref, adv, mask = make_inputs(seed=2, B=8)
    loss, _ = policy_loss(logp, old, adv, mask, "gspo", eps, eps_high, ref, beta)
    want = naive_gspo(logp, old, ref, adv, mask, eps, eps if eps_high is None else eps_high, beta)
    (grad,) = torch.autograd.grad(loss, logp)
    (want_grad,) = torch.autograd.grad(want, logp)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)


def test_gspo_on_policy_equals_grpo_and_clips_whole_sequences() -> None:
    logp, old, _, adv, mask = make_inputs(seed=4)
    # on-policy (ratio 1) the sequence ratio's gradient is the token mean of grad logp: GSPO == GRPO
    gspo, _ = policy_loss(logp, None, adv, mask, "gspo")
    grpo, _ = policy_loss(logp, None, adv, mask, "grpo")
    torch.testing.assert_close(gspo, grpo)
    torch.testing.assert_close(torch.autograd.grad(gspo, logp)[0], torch.autograd.grad(grpo, logp)[0])
    # token ratios 1.5 and 1/1.5 average to a sequence ratio of 1: no token is clipped, unlike token-level GRPO
    x = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    old = torch.log(torch.tensor([[1 / 1.5, 1.5]], dtype=torch.float64))
    one = torch.tensor([1.0], dtype=torch.float64)
    loss, stats = policy_loss(x, old, one, torch.ones(1, 2), "gspo")
    assert (torch.autograd.grad(loss, x)[0] != 0).all() and stats["clip_frac"].item() == 0.0
    loss, _ = policy_loss(x, old, one, torch.ones(1, 2), "grpo")
    assert torch.autograd.grad(loss, x)[0][0, 0] == 0  # the token at ratio 1.5 is clipped
    # a sequence above 1 + eps_high with A > 0 is clipped as a whole: every token loses its gradient
    loss, stats = policy_loss(x, old - 0.3, one, torch.ones(1, 2), "gspo")
    assert torch.equal(torch.autograd.grad(loss, x)[0], torch.zeros(1, 2, dtype=torch.float64))
    assert stats["clip_frac_high"].item() == 1.0


def test_gspo_micro_batches_add_up_with_row_shares() -> None:
    """The module's accumulation rule for gspo is grpo's: rows split, each piece scaled by rows / mini-batch rows."""
    logp, old, ref, adv, mask = make_inputs(seed=7, B=8)
    full, _ = policy_loss(logp, old, adv, mask, "gspo", 0.2, 0.28, ref, 0.04)
    pieces = [
        policy_loss(logp[r], old[r], adv[r], mask[r], "gspo", 0.2, 0.28, ref[r], 0.04)[0] * len(r) / 8
        for r in torch.arange(8).split(3)
    ]
    torch.testing.assert_close(sum(pieces), full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        torch.autograd.grad(sum(pieces), logp)[0], torch.autograd.grad(full, logp)[0], rtol=1e-12, atol=1e-12
    )


def test_clipped_tokens_have_zero_gradient_and_unclipped_do_not() -> None:
    logp = torch.zeros(1, 4, dtype=torch.float64, requires_grad=True)
    # ratios 1.5, 0.5, 1.1, 0.9 with A > 0: 1.5 is clipped above (no grad), the others keep their gradient
    old = torch.log(1 / torch.tensor([[1.5, 0.5, 1.1, 0.9]], dtype=torch.float64))
    loss, stats = policy_loss(logp, old, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 4), "bnpo")
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad[0, 0] == 0 and (grad[0, 1:] != 0).all()
    assert stats["clip_frac_high"].item() == pytest.approx(0.25) and stats["clip_frac_low"].item() == 0.0
    # with A < 0 the low side clips: ratio 0.5 gets no gradient, 1.5 keeps it
    loss, stats = policy_loss(logp, old, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 4), "bnpo")
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad[0, 1] == 0 and grad[0, 0] != 0
    assert stats["clip_frac_low"].item() == pytest.approx(0.25)


def test_cispo_gradient_flows_through_logp_only() -> None:
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-3.0, -2.0]], dtype=torch.float64, requires_grad=True)  # ratio e^2 = 7.39 -> clamped to 6
    adv = torch.tensor([0.5], dtype=torch.float64)
    loss, _ = policy_loss(logp, old, adv, torch.ones(1, 2), "cispo", epsilon=1.0, epsilon_high=5.0)
    g_logp, g_old = torch.autograd.grad(loss, (logp, old), allow_unused=True)
    assert g_old is None or torch.all(g_old == 0)
    # d/dlogp of -sg(w_c) A logp / 2 tokens
    torch.testing.assert_close(g_logp, torch.tensor([[-6.0 * 0.5 / 2, -1.0 * 0.5 / 2]], dtype=torch.float64))


def test_on_policy_grpo_value_is_minus_mean_advantage() -> None:
    logp, _, _, adv, mask = make_inputs(seed=3)
    loss, stats = policy_loss(logp, None, adv, mask, "grpo")
    active = mask.sum(1) > 0
    torch.testing.assert_close(loss, -(adv * active).sum() / len(adv))
    assert stats["ratio_mean"].item() == pytest.approx(1.0)


def test_focal_scaling_equals_scaling_the_group_loss() -> None:
    """g >= 0 scales min(wA, clip(w)A): F-GRPO's loss of a group = g * GRPO's loss of that group."""
    logp, old, _, adv, mask = make_inputs(seed=5, B=4)
    mask[0] = 1.0
    base, _ = policy_loss(logp, old, adv, mask, "grpo")
    scaled, _ = policy_loss(logp, old, adv * 0.3, mask, "grpo")
    torch.testing.assert_close(scaled, 0.3 * base)


def test_kl_k3_properties() -> None:
    logp = torch.randn(5, 6, dtype=torch.float64)
    assert torch.equal(kl_k3(logp, logp), torch.zeros_like(logp))
    assert (kl_k3(logp, logp + torch.randn_like(logp)) >= 0).all()
    # unbiased: E_{x~p}[k3] = KL(p||q) on a small categorical
    p = torch.softmax(torch.randn(7, dtype=torch.float64), 0)
    q = torch.softmax(torch.randn(7, dtype=torch.float64), 0)
    expected_k3 = (p * kl_k3(p.log(), q.log())).sum()
    torch.testing.assert_close(expected_k3, (p * (p.log() - q.log())).sum())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"loss_type": "ppo"}, "loss_type"),
        ({"loss_type": "dr_grpo"}, "max_completion_length"),
        ({"beta": 0.1}, "ref_logp"),
        ({"advantages": torch.zeros(3, 1)}, "advantages"),
        ({"mask": torch.ones(2, 2)}, "mask shape"),
    ],
)
def test_bad_input(kwargs: dict, match: str) -> None:
    args = {"logp": torch.zeros(3, 4), "old_logp": None, "advantages": torch.zeros(3), "mask": torch.ones(3, 4)}
    args |= kwargs
    with pytest.raises(ValueError, match=match):
        policy_loss(**args)


# ---------------------------------------------------------------- TRL 1.16 parity (runs TRL's own code)

HAS_TRL = importlib.util.find_spec("trl") is not None


def trl_loss(loss_type, logp, old, ref, adv, mask, eps_low, eps_high, beta, lmax, num_items, level="token"):
    from trl.trainer.grpo_trainer import GRPOTrainer

    B, T = logp.shape
    stub = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=beta,
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=lmax,
        accelerator=SimpleNamespace(num_processes=1, gather=lambda x: x, reduce=lambda x, reduction="sum": x),
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
    )
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": torch.tensor(float(num_items)),
    }
    return GRPOTrainer._compute_loss(stub, None, inputs), stub._metrics["train"]


@pytest.mark.skipif(not HAS_TRL, reason="trl is not installed (pip install -e .[dev])")
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_parity_with_trl_grpo_trainer(loss_type: str, beta: float, gamma: float) -> None:
    logp, old, ref, _, mask = make_inputs(seed=11, B=8, T=9)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    adv = group_advantages(rewards, gamma=gamma, eps=1e-4).double().reshape(-1)  # (B,)
    num_items = float(mask.sum())
    if loss_type == "cispo":  # TRL's absolute cap C == our [1 - eps, 1 + eps_high] with eps >= 1, 1 + eps_high = C
        ours, _ = policy_loss(logp, old, adv, mask, "cispo", 1.0, 5.0, ref, beta, num_items=num_items)
        theirs, metrics = trl_loss("cispo", logp, old, ref, adv, mask, 0.2, 6.0, beta, 9, num_items)
    else:
        ours, stats = policy_loss(logp, old, adv, mask, loss_type, 0.2, 0.28, ref, beta, 9, num_items)
        theirs, metrics = trl_loss(loss_type, logp, old, ref, adv, mask, 0.2, 0.28, beta, 9, num_items)
        assert stats["clip_frac_high"].item() == pytest.approx(metrics["clip_ratio/high_mean"][0])
        assert stats["clip_frac_low"].item() == pytest.approx(metrics["clip_ratio/low_mean"][0])
        if beta > 0:
            assert stats["kl"].item() == pytest.approx(metrics["kl"][0])
    (g_ours,) = torch.autograd.grad(ours, logp)
    (g_theirs,) = torch.autograd.grad(theirs, logp)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not HAS_TRL, reason="trl is not installed (pip install -e .[dev])")
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize(("eps", "eps_high", "spread"), [(3e-4, 4e-4, 1e-3), (0.2, 0.28, 1.0)])
def test_gspo_parity_with_trl_sequence_level(beta: float, eps: float, eps_high: float, spread: float) -> None:
    """loss_type='gspo' == TRL 1.16 loss_type='grpo', importance_sampling_level='sequence' (the GSPO setup)."""
    logp, old, ref, _, mask = make_inputs(seed=13, B=8, T=9)
    old = (logp.detach() + (old - logp.detach()) * spread).detach()  # some sequences inside the clip range
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    adv = group_advantages(rewards, gamma=0.5, eps=1e-4).double().reshape(-1)  # (B,)
    ours, stats = policy_loss(logp, old, adv, mask, "gspo", eps, eps_high, ref, beta)
    theirs, metrics = trl_loss("grpo", logp, old, ref, adv, mask, eps, eps_high, beta, 9, 1.0, level="sequence")
    (g_ours,) = torch.autograd.grad(ours, logp)
    (g_theirs,) = torch.autograd.grad(theirs, logp)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-10, atol=1e-10)
    assert g_ours.abs().sum() > 0
    if beta > 0:
        assert stats["kl"].item() == pytest.approx(metrics["kl"][0])
