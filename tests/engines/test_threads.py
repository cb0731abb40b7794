"""The generation's thread count: torch's own by default, a number, or the cores no other process keeps busy."""

from __future__ import annotations

import pytest
import torch

from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.engines.hf import HFEngine
from lit_fgrpo.engines.threads import allowed_cores, check_threads, free_cores, generation_threads
from lit_fgrpo.errors import ConfigError
from tests.engines.test_hf import prompts
from tests.tiny_models import EOS, PAD, hf_engine_model


def test_free_cores_counts_allowed_cores_and_never_returns_zero() -> None:
    assert 1 <= free_cores() <= len(allowed_cores())


def test_generation_threads_sets_and_restores_torch_threads() -> None:
    before = torch.get_num_threads()
    with generation_threads(None) as count:
        assert count == torch.get_num_threads() == before  # the default leaves the caller's count
    with generation_threads(2) as count:
        assert count == torch.get_num_threads() == 2
    assert torch.get_num_threads() == before
    with generation_threads("auto") as count:
        assert torch.get_num_threads() == count and 1 <= count <= len(allowed_cores())
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("bad", [0, -1, 1.5, "two", True])
def test_bad_thread_settings_are_refused_naming_the_flag(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"--rollout.engine_kwargs.threads must be a whole number >= 1"):
        check_threads(bad, "--rollout.engine_kwargs.threads")  # type: ignore[arg-type]


def test_the_engine_generates_the_same_tokens_at_any_thread_count() -> None:
    model = hf_engine_model()
    sampling = SamplingConfig(n=3, max_tokens=8, seed=4)
    one = HFEngine(model, PAD, EOS, threads=1).generate(prompts(3), sampling)
    two = HFEngine(model, PAD, EOS, threads=2).generate(prompts(3), sampling)
    assert one.completion_ids == two.completion_ids
    assert torch.get_num_threads() == 1  # the test pin is back
