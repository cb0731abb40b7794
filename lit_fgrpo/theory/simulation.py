"""Categorical policy simulation of F-GRPO (paper Section 5.1 / Appendix J, after BroRL).

A softmax policy ``pi = softmax(z)`` over ``A`` actions, ``C`` of which are correct (reward +1) and the rest
incorrect (reward -1). Logits start at 5.0 for one *anchor* correct action, 3.0 for the other correct actions and
0.0 for incorrect ones. Each step samples ``N`` actions i.i.d. from the current policy, centres the rewards on the
group mean (``r~_j = R_j - mean_k R_k``, no std), scales by the focal factor ``g = (1 - mu_hat)^gamma`` with
``mu_hat`` the fraction of sampled actions that are correct, and takes one AdamW step on

* ``surrogate="ratio"`` (reading T of ``docs/paper.md`` section 5, the default)::

      L = -(g / N) * sum_j r~_j * pi(a_j) / sg(pi(a_j))

  whose gradient is the REINFORCE log-prob gradient, so an unsampled logit gets no gradient;
* ``surrogate="linear"`` (reading L, the loss as the paper writes it)::

      L = -(g / N) * sum_j r~_j * pi(a_j)

Gradients are computed in closed form over the whole vocabulary from the per-action sample counts (no autograd),
and AdamW is written out by hand, so a 1,000-step run takes about a second for ``N <= 8192``.

Metrics: ``Q_pos(t) = sum_{a in A+} pi_t(a)`` and the retained positive mass (paper eq. 26)::

    M_ret(t) = 1 - sum_{a in A+} max(0, pi_0(a) - pi_t(a)) / sum_{a in A+} pi_0(a)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import Tensor

Surrogate = Literal["ratio", "linear"]

ANCHOR_LOGIT = 5.0
OTHER_CORRECT_LOGIT = 3.0
INCORRECT_LOGIT = 0.0
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
DTYPE = torch.float64
MULTINOMIAL_MIN_N = 32_768
"""From this group size on, counts are drawn with numpy's O(A) multinomial instead of an O(N log A) inverse CDF."""


@dataclass
class SimulationResult:
    """Trajectory of one categorical-simulation run.

    The arrays are recorded at the optimisation steps in ``steps`` (step 0 is the initial policy; the last entry
    is always the final step).
    """

    group_size: int
    gamma: float
    seed: int
    lr: float
    surrogate: str
    weight_decay: float
    num_actions: int
    num_correct: int
    num_steps: int
    steps: np.ndarray = field(repr=False)
    """(R,) step indices at which the metrics were recorded."""
    q_pos: np.ndarray = field(repr=False)
    """(R,) total correct mass Q_pos(t)."""
    m_ret: np.ndarray = field(repr=False)
    """(R,) retained positive mass M_ret(t)."""
    entropy: np.ndarray = field(repr=False)
    """(R,) policy entropy in nats."""

    @property
    def final_q_pos(self) -> float:
        """Q_pos after the last step."""
        return float(self.q_pos[-1])

    @property
    def final_m_ret(self) -> float:
        """M_ret after the last step."""
        return float(self.m_ret[-1])

    @property
    def final_entropy(self) -> float:
        """Policy entropy after the last step."""
        return float(self.entropy[-1])


def initial_logits(num_actions: int, num_correct: int) -> Tensor:
    """Initial logits: index 0 is the anchor correct action (5.0), 1..C-1 the other correct ones (3.0), rest 0.0.

    Args:
        num_actions: Vocabulary size A.
        num_correct: Number of correct actions C (1 <= C < A).

    Returns:
        (A,) float64 logits.
    """
    if not 1 <= num_correct < num_actions:
        raise ValueError(f"need 1 <= num_correct < num_actions, got {num_correct=} {num_actions=}")
    z = torch.full((num_actions,), INCORRECT_LOGIT, dtype=DTYPE)  # (A,)
    z[:num_correct] = OTHER_CORRECT_LOGIT
    z[0] = ANCHOR_LOGIT
    return z


def sample_counts(
    probs: Tensor, group_size: int, generator: torch.Generator, rng: np.random.Generator | None = None
) -> Tensor:
    """Counts ``n ~ Multinomial(N, probs)`` of ``N`` i.i.d. draws from a categorical distribution.

    For ``N < MULTINOMIAL_MIN_N`` (or without ``rng``) by inverse CDF: ``a_j = min{a : F(a) > u_j F(A-1)}`` with
    ``u_j ~ U[0, 1)`` and ``F`` the cumulative sum of ``probs``, O(N log A); for larger N by numpy's sequential
    binomial multinomial sampler, O(A), which is faster there.

    Args:
        probs: (A,) probabilities (need not sum exactly to 1).
        group_size: Number of draws N.
        generator: Torch random generator (inverse-CDF path).
        rng: Numpy random generator (multinomial path).

    Returns:
        (A,) counts n_a (same dtype as ``probs``) with sum_a n_a = N.
    """
    if rng is not None and group_size >= MULTINOMIAL_MIN_N:
        p = probs.numpy()  # (A,)
        counts = rng.multinomial(group_size, p / p.sum())  # (A,)
        return torch.from_numpy(counts).to(probs.dtype)  # (A,)
    cdf = torch.cumsum(probs, dim=0)  # (A,)
    u = torch.rand(group_size, generator=generator, dtype=probs.dtype) * cdf[-1]  # (N,)
    actions = torch.searchsorted(cdf, u, right=True).clamp_(max=probs.numel() - 1)  # (N,)
    return torch.bincount(actions, minlength=probs.numel()).to(probs.dtype)  # (A,)


def group_advantage_weights(counts: Tensor, num_correct: int, gamma: float) -> tuple[Tensor, float]:
    """Per-action summed advantages ``c_a = sum_{j: a_j = a} r~_j`` and the focal factor.

    With R = +1 for correct and -1 for incorrect actions, ``mean_k R_k = 2 mu_hat - 1`` and ``r~ = R - mean``,
    ``g = (1 - mu_hat)^gamma`` with ``mu_hat = #correct / N``.

    Args:
        counts: (A,) sample counts, correct actions first.
        num_correct: Number of correct actions C.
        gamma: Focal exponent (0 gives plain GRPO).

    Returns:
        ((A,) summed centred rewards c, focal factor g).
    """
    n = float(counts.sum())
    mu_hat = float(counts[:num_correct].sum()) / n
    baseline = 2.0 * mu_hat - 1.0
    c = counts.clone()  # (A,)
    c[:num_correct] *= 1.0 - baseline  # r~ = +1 - mean R on correct actions
    c[num_correct:] *= -1.0 - baseline  # r~ = -1 - mean R on incorrect actions
    return c, (1.0 - mu_hat) ** gamma


def surrogate_grad(probs: Tensor, c: Tensor, scale: float, surrogate: Surrogate) -> Tensor:
    """Closed-form gradient of the surrogate loss with respect to the logits.

    With ``s = g / N`` and ``c_a = sum_{j: a_j = a} r~_j``:

    * ratio:  ``L = -s sum_j r~_j pi(a_j)/sg(pi(a_j))``, ``dL/dz = -s (c - (sum_a c_a) pi)``
      (``sum_a c_a = 0`` for a mean baseline, so only sampled logits move);
    * linear: ``L = -s sum_j r~_j pi(a_j)``, ``dL/dz = -s pi * (c - sum_a c_a pi_a)``.

    Args:
        probs: (A,) current policy pi.
        c: (A,) per-action summed centred rewards.
        scale: ``s = g / N``.
        surrogate: ``"ratio"`` or ``"linear"``.

    Returns:
        (A,) gradient of L with respect to z.
    """
    if surrogate == "ratio":
        return -scale * (c - c.sum() * probs)  # (A,)
    if surrogate == "linear":
        return -scale * probs * (c - torch.dot(c, probs))  # (A,)
    raise ValueError(f"unknown surrogate {surrogate!r}; expected 'ratio' or 'linear'")


def surrogate_loss(logits: Tensor, actions: Tensor, advantages: Tensor, scale: float, surrogate: Surrogate) -> Tensor:
    """The surrogate loss as written, for autograd (reference for :func:`surrogate_grad`).

    Args:
        logits: (A,) logits z.
        actions: (N,) sampled action ids.
        advantages: (N,) centred rewards r~_j.
        scale: ``s = g / N``.
        surrogate: ``"ratio"`` or ``"linear"``.

    Returns:
        Scalar loss ``-s sum_j r~_j pi(a_j) [/ sg(pi(a_j))]``.
    """
    p = torch.softmax(logits, dim=0)[actions]  # (N,)
    if surrogate == "ratio":
        p = p / p.detach()  # (N,)
    elif surrogate != "linear":
        raise ValueError(f"unknown surrogate {surrogate!r}; expected 'ratio' or 'linear'")
    return -scale * (advantages * p).sum()


@dataclass
class AdamWState:
    """First and second moments of a hand-written AdamW (same update as ``torch.optim.AdamW``)."""

    exp_avg: Tensor
    exp_avg_sq: Tensor
    step: int = 0


def adamw_step(
    param: Tensor, grad: Tensor, state: AdamWState, lr: float, weight_decay: float, eps: float = ADAM_EPS
) -> None:
    """One in-place AdamW update (decoupled weight decay, bias-corrected moments).

    ``z <- z (1 - lr wd)``; ``m <- b1 m + (1-b1) g``; ``v <- b2 v + (1-b2) g^2``;
    ``z <- z - lr m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps)``.

    Args:
        param: (A,) parameters, updated in place.
        grad: (A,) gradient.
        state: Moments, updated in place.
        lr: Learning rate.
        weight_decay: Decoupled weight decay.
        eps: Denominator epsilon.
    """
    beta1, beta2 = ADAM_BETAS
    state.step += 1
    if weight_decay:
        param.mul_(1.0 - lr * weight_decay)
    state.exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
    state.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
    bias1 = 1.0 - beta1**state.step
    bias2 = 1.0 - beta2**state.step
    denom = (state.exp_avg_sq / bias2).sqrt_().add_(eps)  # (A,)
    param.addcdiv_(state.exp_avg, denom, value=-lr / bias1)


def retained_positive_mass(probs0_pos: Tensor, probs_pos: Tensor) -> float:
    """``M_ret = 1 - sum_{a in A+} max(0, pi_0(a) - pi_t(a)) / sum_{a in A+} pi_0(a)`` (paper eq. 26).

    Args:
        probs0_pos: (C,) initial probabilities of the correct actions.
        probs_pos: (C,) current probabilities of the correct actions.

    Returns:
        M_ret in [0, 1].
    """
    lost = (probs0_pos - probs_pos).clamp_(min=0.0).sum()
    return float(1.0 - lost / probs0_pos.sum())


def entropy(probs: Tensor) -> float:
    """Shannon entropy ``-sum_a pi_a log pi_a`` in nats of a (A,) distribution."""
    return float(-(probs * torch.log(probs.clamp(min=1e-300))).sum())


def simulate_categorical(
    group_size: int,
    gamma: float,
    steps: int = 1000,
    lr: float = 1e-2,
    seed: int = 0,
    num_actions: int = 128_000,
    num_correct: int = 10_000,
    surrogate: Surrogate = "ratio",
    weight_decay: float = 0.0,
    record_every: int = 1,
) -> SimulationResult:
    """Run the categorical F-GRPO simulation for one (N, gamma, seed).

    Each step: ``n ~ Multinomial(N, pi_t)``; ``c_a = n_a (R_a - mean R)``; ``g = (1 - mu_hat)^gamma``;
    ``grad = dL/dz`` in closed form (see :func:`surrogate_grad`); AdamW(lr, betas 0.9/0.999, eps 1e-8,
    ``weight_decay``) on z.

    Args:
        group_size: Samples per step N.
        gamma: Focal exponent.
        steps: Number of optimisation steps T.
        lr: AdamW learning rate.
        seed: Seed of the sampling generator.
        num_actions: Vocabulary size A.
        num_correct: Number of correct actions C.
        surrogate: ``"ratio"`` (reading T, default) or ``"linear"`` (reading L).
        weight_decay: AdamW decoupled weight decay.
        record_every: Record metrics every this many steps (the final step is always recorded).

    Returns:
        The recorded trajectory and the settings.
    """
    if group_size < 1 or steps < 0 or record_every < 1:
        raise ValueError(
            f"need group_size >= 1, steps >= 0, record_every >= 1; got {group_size=} {steps=} {record_every=}"
        )
    if surrogate not in ("ratio", "linear"):
        raise ValueError(f"unknown surrogate {surrogate!r}; expected 'ratio' or 'linear'")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # vectors of ~1e5 elements: intra-op threads only add overhead (3-10x on 2 busy cores)
    try:
        return _simulate(
            group_size, gamma, steps, lr, seed, num_actions, num_correct, surrogate, weight_decay, record_every
        )
    finally:
        torch.set_num_threads(threads)


def _simulate(
    group_size: int,
    gamma: float,
    steps: int,
    lr: float,
    seed: int,
    num_actions: int,
    num_correct: int,
    surrogate: Surrogate,
    weight_decay: float,
    record_every: int,
) -> SimulationResult:
    """Body of :func:`simulate_categorical` (arguments validated, single-threaded)."""
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    z = initial_logits(num_actions, num_correct)  # (A,)
    state = AdamWState(torch.zeros_like(z), torch.zeros_like(z))
    probs = torch.softmax(z, dim=0)  # (A,)
    probs0_pos = probs[:num_correct].clone()  # (C,)
    rec_steps: list[int] = []
    rec_q: list[float] = []
    rec_m: list[float] = []
    rec_h: list[float] = []

    def record(t: int) -> None:
        rec_steps.append(t)
        rec_q.append(float(probs[:num_correct].sum()))
        rec_m.append(retained_positive_mass(probs0_pos, probs[:num_correct]))
        rec_h.append(entropy(probs))

    record(0)
    for t in range(1, steps + 1):
        counts = sample_counts(probs, group_size, generator, rng)  # (A,)
        c, g = group_advantage_weights(counts, num_correct, gamma)  # (A,)
        grad = surrogate_grad(probs, c, g / group_size, surrogate)  # (A,)
        adamw_step(z, grad, state, lr, weight_decay)
        probs = torch.softmax(z, dim=0)  # (A,)
        if t % record_every == 0 or t == steps:
            record(t)
    return SimulationResult(
        group_size=group_size,
        gamma=float(gamma),
        seed=seed,
        lr=lr,
        surrogate=surrogate,
        weight_decay=weight_decay,
        num_actions=num_actions,
        num_correct=num_correct,
        num_steps=steps,
        steps=np.asarray(rec_steps, dtype=np.int64),
        q_pos=np.asarray(rec_q),
        m_ret=np.asarray(rec_m),
        entropy=np.asarray(rec_h),
    )
