"""Tiny, offline building blocks for the multi-turn rollout tests: a chat policy, arithmetic prompts, environments.

The tokenizer is :func:`tests.environments.tiny_chat.chat_tokenizer` (ChatML, about 400 ids) saved to a folder, so
that the module and the data module load it as they load a real one; the policy is a random 2-layer Llama over it.
"""

from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from lit_fgrpo.data import PromptDataModule, PromptRecord, render_records
from lit_fgrpo.data.records import SourceExample
from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.environments import TextEnvironment
from lit_fgrpo.training.module import FGRPOModule
from lit_fgrpo.training.module_settings import grouped_settings
from tests.environments.tiny_chat import chat_tokenizer

CHAT_MODEL = {
    "model_type": "llama",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
    "initializer_range": 0.15,
}
"""The policy: a random Llama whose samples vary (``initializer_range`` 0.15)."""


@lru_cache(maxsize=1)
def tokenizer_folder() -> str:
    """The tiny chat tokenizer saved once per session (a folder, as ``--model.policy.tokenizer`` names one)."""
    folder = Path(tempfile.mkdtemp(prefix="lit_fgrpo_chat_tokenizer_"))
    chat_tokenizer().save_pretrained(folder)
    return str(folder)


def stops() -> list[int]:
    """A quarter of the vocabulary ends a turn: short random replies from the random policy."""
    return list(range(3, len(chat_tokenizer()), 4))


def sampling(n: int = 4, max_tokens: int = 6) -> SamplingConfig:
    return SamplingConfig(n=n, max_tokens=max_tokens, stop_token_ids=stops())


def chat_module(**kwargs: Any) -> FGRPOModule:
    """The tiny chat policy as an FGRPOModule; ``kwargs`` name settings flat or as groups."""
    settings: dict[str, Any] = {"model_config": CHAT_MODEL, "tokenizer": tokenizer_folder(), "lr": 1e-2}
    return FGRPOModule(**grouped_settings(settings | kwargs))


def arithmetic_data(**kwargs: Any) -> PromptDataModule:
    """Arithmetic prompts in the chat template: 32 training prompts, 2 per step, 4 held out."""
    settings: dict[str, Any] = dict(
        source="arithmetic",
        splits={"num_train": 32, "num_val": 4, "num_test": 4, "val_size": 4},
        loader={"prompts_per_step": 2},
        arithmetic={"max_value": 9},
        tokenizer_path=tokenizer_folder(),
    )
    return PromptDataModule(**(settings | kwargs))


def records(count: int = 4, first: int = 0) -> list[PromptRecord]:
    """``count`` arithmetic records rendered through the chat template (with their messages), at stream positions
    ``first``, ``first + 1``, ..."""
    examples = [
        SourceExample(f"What is {i} + {i + 1}?", {"answer": str(2 * i + 1)}, index=i)
        for i in range(first, first + count)
    ]
    rendered = render_records(examples, chat_tokenizer(), max_prompt_length=64)
    for record in rendered:
        record.position = record.index
    return rendered


MULTI_TURN = "tests.rollout.multiturn_setup:Parity"
"""The test environment below, by path."""


class Parity(TextEnvironment):
    """Two replies: the first is told "Again.", the second ends the episode; reward 1 when the two replies' total
    length is odd. The random policy's replies vary in length, so most groups are mixed."""

    def reset(self, **row: Any) -> None:
        self.replies: list[str] = []

    def step(self, reply: str) -> tuple[str | None, bool]:
        self.replies.append(reply)
        return (None, True) if len(self.replies) >= 2 else ("Again.", False)

    def get_reward(self) -> float:
        return float(sum(len(r) for r in self.replies) % 2)


class FlakyParity(Parity):
    """:class:`Parity` whose ``step`` raises in every third episode made (an environment fault)."""

    made = 0

    def reset(self, **row: Any) -> None:
        super().reset(**row)
        FlakyParity.made += 1
        self.broken = FlakyParity.made % 3 == 0

    def step(self, reply: str) -> tuple[str | None, bool]:
        if self.broken:
            raise RuntimeError("the checker crashed")
        return super().step(reply)


def rollout_settings(**kwargs: Any) -> dict[str, Any]:
    """RolloutCallback settings of a multi-turn run on the HF engine: Parity, 2 turns of at most 6 tokens."""
    settings: dict[str, Any] = dict(
        engine="hf",
        environment=MULTI_TURN,
        max_turns=2,
        max_episode_tokens=32,
        sampling=sampling(),
        val_samples=4,
        validate_at_start=False,
        correct_threshold=0.5,
    )
    return settings | kwargs


def replies_seen(prompts: list[str], completions: list[str], environments: list[Any], **columns: Any) -> list[float]:
    """A reward function written for TRL's environments: it reads each episode's instance (``environments=``)."""
    return [10.0 * len(env.replies) for env in environments]
