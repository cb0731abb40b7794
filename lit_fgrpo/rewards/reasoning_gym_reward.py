"""reasoning-gym scorers as reward functions, and a thresholded correctness verdict.

Each dataset's ``score_answer(answer, entry)`` needs the generated entry, so records from the reasoning-gym source
carry it in the ``entry`` column. Scores are not always 0/1: countdown gives 0.01 for no answer and 0.05 for a wrong
one, so correctness is judged by a threshold, never by ``score > 0``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from lit_fgrpo.rewards.math_answer import extract_final_answer


@lru_cache(maxsize=256)
def _scorer(dataset_name: str) -> Callable[..., float]:
    from reasoning_gym import get_score_answer_fn

    return get_score_answer_fn(dataset_name)


def extract_reasoning_gym_answer(completion: str) -> str:
    """The ``<answer>`` tag content or last boxed expression, else the whole completion stripped."""
    extracted = extract_final_answer(completion)
    return completion.strip() if extracted is None else extracted


def reasoning_gym_reward(prompts: list[str], completions: list[str], **columns: list[Any]) -> list[float | None]:
    """The dataset's own score in [0, 1] for each completion, from the ``entry`` column.

    Raises:
        KeyError: If there is no ``entry`` column or an entry lacks ``metadata.source_dataset``.
    """
    if "entry" not in columns:
        raise KeyError("reasoning_gym_reward needs an 'entry' column (use the reasoning_gym data source)")
    scores: list[float | None] = []
    for completion, entry in zip(completions, columns["entry"]):
        score_answer = _scorer(entry["metadata"]["source_dataset"])
        scores.append(float(score_answer(answer=extract_reasoning_gym_answer(completion), entry=entry)))
    return scores


class ReasoningGymCorrect:
    """Correctness verdict: 1.0 when the reasoning-gym score is at least ``threshold``, else 0.0.

    Args:
        threshold: Lowest score that counts as correct; the default 1.0 accepts only full marks.
    """

    __name__ = "reasoning_gym_correct"

    def __init__(self, threshold: float = 1.0) -> None:
        if not 0 < threshold <= 1:
            raise ValueError(f"reasoning_gym_correct.threshold must be in (0, 1], got {threshold}")
        self.threshold = threshold

    def __call__(self, prompts: list[str], completions: list[str], **columns: list[Any]) -> list[float | None]:
        scores = reasoning_gym_reward(prompts, completions, **columns)
        return [None if s is None else float(s >= self.threshold - 1e-9) for s in scores]


def reasoning_gym_correct(threshold: float = 1.0) -> ReasoningGymCorrect:
    """A correctness function for :func:`~lit_fgrpo.rewards.base.score_completions` (see :class:`ReasoningGymCorrect`)."""
    return ReasoningGymCorrect(threshold)
