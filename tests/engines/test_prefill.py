"""The prompts' pass: a common beginning run once, against every prompt run whole (``generate``, the reference)."""

from __future__ import annotations

import pytest
import torch

from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.engines.hf import HFEngine
from lit_fgrpo.engines.prefill import MIN_SHARED, common_prefix
from tests.engines.test_decode import assert_same, batch_sizes
from tests.tiny_models import EOS, PAD, hf_engine_model

HEAD = [5, 9, 17, 33, 2, 41, 8, 12, 60, 7]
"""A shared beginning longer than MIN_SHARED, like a chat template's system message."""


def templated(count: int) -> list[list[int]]:
    """``HEAD`` followed by 1 to 5 tokens of each prompt's own."""
    g = torch.Generator().manual_seed(4)
    return [HEAD + torch.randint(3, 64, (1 + i % 5,), generator=g).tolist() for i in range(count)]


def test_common_prefix_leaves_each_prompt_a_token() -> None:
    assert common_prefix([[1, 2, 3], [1, 2, 4]]) == 2
    assert common_prefix([[1, 2], [1, 2, 3]]) == 1  # the shorter prompt keeps its last token
    assert common_prefix([[4, 5], [6, 5]]) == 0
    assert len(HEAD) >= MIN_SHARED


@pytest.mark.parametrize("lean", [True, False])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_shared_beginning_is_run_once_and_draws_the_tokens_of_whole_prompts(kind: str, lean: bool) -> None:
    model = hf_engine_model(kind)
    sizes = batch_sizes(model)
    sampling = SamplingConfig(n=3, max_tokens=9, temperature=0.9, seed=6, stop_token_ids=[3, 4, 5])
    own = HFEngine(model, PAD, EOS, lean=lean).generate(templated(5), sampling)
    assert sizes[:2] == [1, 5]  # the shared beginning as one row, then the 5 prompts' own tokens
    ref = HFEngine(model, PAD, EOS, own_loop=False).generate(templated(5), sampling)
    assert_same(own, ref)
    assert any(own.finished) and not all(own.finished)


def test_prompts_without_a_long_common_beginning_go_through_whole() -> None:
    model = hf_engine_model()
    sizes = batch_sizes(model)
    short = [HEAD[:3] + [10 + i] for i in range(4)]  # 3 shared tokens: under MIN_SHARED
    HFEngine(model, PAD, EOS).generate(short, SamplingConfig(n=2, max_tokens=3, seed=0))
    assert sizes[0] == 4
