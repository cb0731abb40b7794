"""RolloutCollector: shapes, prompt-major rows, rewards against a direct call, columns, seeding, pad fallback."""

from __future__ import annotations

from typing import Any

import torch

from lit_fgrpo.data import PromptRecord
from lit_fgrpo.engines.hf import HFEngine
from lit_fgrpo.rollout import RolloutCollector, SamplingConfig, columns_per_completion, pad_id_of
from lit_fgrpo.tasks.registry import load_tokenizer
from tests.training.tiny_setup import tiny_module

SEEN: dict[str, Any] = {}


def echo_reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
    """Reward = number of words; remembers the columns it was given."""
    SEEN.update(columns)
    return [float(len(c.split())) for c in completions]


def odd_is_correct(prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
    return [float(len(c.split()) % 2) for c in completions]


def records() -> list[PromptRecord]:
    return [
        PromptRecord(prompt="<bos> WALL PATH", prompt_ids=[1, 9, 8], columns={"answer": "a"}, index=0),
        PromptRecord(prompt="<bos> PATH", prompt_ids=[1, 8], columns={"answer": "b", "extra": 3}, index=1),
    ]


def collector() -> RolloutCollector:
    module = tiny_module()
    tokenizer = module.tokenizer
    engine = HFEngine(module.policy, pad_id_of(tokenizer), tokenizer.eos_token_id)
    return RolloutCollector(engine, tokenizer, [echo_reward], correctness_fn=odd_is_correct)


def test_collect_scores_every_completion_prompt_major() -> None:
    col = collector()
    sampling = SamplingConfig(n=3, max_tokens=5)
    batch = col.collect(records(), sampling, seed=7)
    P, G = 2, 3
    assert batch.rewards.shape == batch.correct.shape == (P, G)
    assert batch.input_ids.shape[0] == P * G and batch.completion_mask.shape[1] <= 5
    assert batch.prompts == ["<bos> WALL PATH"] * 3 + ["<bos> PATH"] * 3
    # rewards and verdicts equal the functions applied directly to the decoded completions
    expected = torch.tensor(echo_reward(batch.prompts, batch.completions)).view(P, G)
    torch.testing.assert_close(batch.rewards, expected)
    assert batch.correct.view(-1).tolist() == [bool(x) for x in odd_is_correct(batch.prompts, batch.completions)]
    # per-completion columns, prompt-major, None where a prompt lacks one; completion lengths added
    assert SEEN["answer"] == ["a"] * 3 + ["b"] * 3 and SEEN["extra"] == [None] * 3 + [3] * 3
    assert SEEN["completion_length"] == [len(c) for c in batch.completion_ids]
    assert batch.stats["generated_tokens"] == sum(len(c) for c in batch.completion_ids)
    # each row's tokens: its prompt (left-padded) then its completion
    width = max(len(p) for p in batch.prompt_ids)
    for row, completion in enumerate(batch.completion_ids):
        prompt = batch.prompt_ids[row // G]
        assert batch.input_ids[row, width - len(prompt) : width].tolist() == prompt
        assert batch.input_ids[row, width : width + len(completion)].tolist() == completion
        assert int(batch.completion_mask[row].sum()) == len(completion)


def test_collect_is_seeded() -> None:
    col = collector()
    sampling = SamplingConfig(n=4, max_tokens=6, temperature=2.0)
    a, b = col.collect(records(), sampling, seed=1), col.collect(records(), sampling, seed=1)
    c = col.collect(records(), sampling, seed=2)
    assert a.completion_ids == b.completion_ids
    assert a.completion_ids != c.completion_ids


def test_columns_per_completion_and_pad_fallback() -> None:
    assert columns_per_completion(records(), 2) == {"answer": ["a", "a", "b", "b"], "extra": [None, None, 3, 3]}
    tokenizer = load_tokenizer("builtin:maze")
    assert pad_id_of(tokenizer) == tokenizer.pad_token_id
    tokenizer.pad_token = None
    assert pad_id_of(tokenizer) == tokenizer.eos_token_id
