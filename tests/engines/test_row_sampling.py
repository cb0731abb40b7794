"""The HF engine's seeded row sampler against references: exact 64-bit SplitMix64, a loop for the inverse CDF,
the two-level search against the full-width one, and the sampled frequencies against the distribution."""

from __future__ import annotations

import random

import pytest
import torch

from lit_fgrpo.distributed.rank_layout import _splitmix64
from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.engines.row_sampling import (
    RowSampler,
    block_size,
    row_keys,
    row_uniforms,
    sample_blocked,
    sample_inverse_cdf,
    splitmix64,
)


def to_signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


def test_splitmix64_on_tensors_is_the_exact_unsigned_mixer() -> None:
    # Python's integers are exact: the tensor version must wrap modulo 2**64 like unsigned arithmetic does.
    rng = random.Random(0)
    values = [0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1] + [rng.getrandbits(64) for _ in range(2000)]
    got = splitmix64(torch.tensor([to_signed(v) for v in values], dtype=torch.int64)).tolist()
    assert got == [to_signed(_splitmix64(v)) for v in values]


def test_row_uniforms_follow_the_formula_and_depend_on_the_row_alone() -> None:
    seeds = [0, 5, (1 << 63) - 1, 12345]
    for step in (0, 1, 63, 10_000):
        u = row_uniforms(row_keys(seeds), step)  # (R,)
        expected = [((_splitmix64(_splitmix64(s) ^ step) >> 11) + 0.5) / 2**53 for s in seeds]
        assert u.tolist() == expected
        assert row_uniforms(row_keys(seeds[2:3]), step).tolist() == expected[2:3]  # alone = in a batch
    many = row_uniforms(row_keys(list(range(20_000))), 7)
    assert float(many.min()) > 0 and float(many.max()) < 1
    assert abs(float(many.mean()) - 0.5) < 0.01 and abs(float(many.var()) - 1 / 12) < 0.003


def loop_inverse_cdf(scores: list[float], u: float) -> int:
    """The textbook inverse CDF, one row, in Python floats."""
    m = max(x for x in scores if x != float("-inf"))
    weights = [0.0 if x == float("-inf") else pow(2.718281828459045, x - m) for x in scores]
    total, acc = sum(weights), 0.0
    for v, w in enumerate(weights):
        acc += w
        if acc > u * total:
            return v
    return max(v for v, w in enumerate(weights) if w > 0)


def test_inverse_cdf_matches_a_loop_and_never_picks_an_excluded_token() -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(64, 50, generator=g) * 2  # (R, V)
    scores[:, ::3] = float("-inf")  # excluded tokens (top-k / top-p filtering)
    u = torch.rand(64, generator=g, dtype=torch.float64)  # (R,)
    u[:4] = torch.tensor([1e-16, 0.5, 1 - 2**-53, 1 - 1e-12], dtype=torch.float64)  # the edges
    tokens = sample_inverse_cdf(scores, u)  # (R,)
    assert tokens.tolist() == [loop_inverse_cdf(row, float(x)) for row, x in zip(scores.tolist(), u.tolist())]
    assert bool(torch.isfinite(scores.gather(1, tokens[:, None])).all())


@pytest.mark.parametrize("vocab", [8, 1000])
def test_sampled_frequencies_match_the_distribution(vocab: int) -> None:
    # 40,000 rows with distinct seeds, one step, the same scores: Pearson's chi-square of the frequencies against
    # softmax within 5 standard deviations of its mean (V - 1 degrees of freedom). An off-by-one in the search
    # (every token taking its neighbour's probability) gives a chi-square in the thousands.
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(vocab, generator=g)  # (V,)
    probs = torch.softmax(scores.double(), dim=-1)  # (V,)
    n = 40_000
    u = row_uniforms(row_keys(list(range(n))), 0)  # (n,)
    tokens = sample_inverse_cdf(scores.expand(n, vocab), u)  # (n,)
    freq = torch.bincount(tokens, minlength=vocab).double() / n  # (V,)
    chi2 = float((n * (freq - probs) ** 2 / probs).sum())
    dof = vocab - 1
    assert chi2 < dof + 5 * (2 * dof) ** 0.5


@pytest.mark.parametrize("vocab", [50, 64, 1000, 49_152, 151_936])  # padded blocks, one block, SmolLM2's, Qwen's
def test_the_two_level_search_draws_the_tokens_of_the_full_width_one(vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    scores = torch.randn(200, vocab, generator=g) * 3  # (R, V)
    scores[:, ::4] = float("-inf")  # excluded tokens
    u = torch.rand(200, generator=g, dtype=torch.float64)  # (R,)
    u[:3] = torch.tensor([1e-16, 1 - 2**-53, 0.5], dtype=torch.float64)  # the edges
    weights = (scores - scores.amax(-1, keepdim=True)).exp()  # (R, V)
    tokens = sample_blocked(weights, u)  # (R,)
    assert tokens.tolist() == sample_inverse_cdf(scores, u).tolist()
    assert bool(torch.isfinite(scores.gather(1, tokens[:, None])).all())
    assert vocab % block_size(vocab) == 0 or block_size(vocab) == 256


@pytest.mark.parametrize("vocab", [17, 64, 49_152])  # one padded block (the maze's vocabulary), one full, many
def test_non_finite_weights_give_an_id_inside_the_vocabulary_as_the_full_width_search(vocab: int) -> None:
    # a policy whose weights went NaN still samples ids the model can embed; the NaN loss is caught after the step
    scores = torch.full((3, vocab), float("nan"))  # (R, V)
    u = torch.tensor([1e-16, 0.5, 1 - 2**-53], dtype=torch.float64)  # (R,)
    tokens = sample_blocked(scores.exp(), u)  # (R,)
    assert tokens.tolist() == sample_inverse_cdf(scores, u).tolist() == [vocab - 1] * 3


def test_two_level_frequencies_match_the_distribution() -> None:
    # as test_sampled_frequencies_match_the_distribution, through the sampler the engine draws with
    g = torch.Generator().manual_seed(2)
    scores = torch.randn(1000, generator=g)  # (V,)
    probs = torch.softmax(scores.double(), dim=-1)  # (V,)
    n = 40_000
    sampler = RowSampler(list(range(n)), SamplingConfig(n=1, max_tokens=1), torch.device("cpu"))
    tokens, logp = sampler.draw(scores.expand(n, 1000), 0)  # (n,), (n,)
    freq = torch.bincount(tokens, minlength=1000).double() / n  # (V,)
    chi2 = float((n * (freq - probs) ** 2 / probs).sum())
    assert chi2 < 999 + 5 * (2 * 999) ** 0.5
    torch.testing.assert_close(logp, torch.log_softmax(scores, -1)[tokens], atol=1e-6, rtol=0)
