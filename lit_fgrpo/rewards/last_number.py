"""The last number of a reply against an integer or decimal answer (the arithmetic task's verifier)."""

from __future__ import annotations

import re
from typing import Any

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (``-12``, ``3.5``, ``1,024`` -> ``1024``), or ``None``.

    A minus sign counts only where it cannot be the operator of an expression: ``7 -3`` reads -3, ``7 - 3`` reads 3.
    """
    matches = list(_NUMBER.finditer(text))
    if not matches:
        return None
    found = matches[-1]
    number = found.group().replace(",", "")
    if number.startswith("-") and found.start() > 0 and text[found.start() - 1].isalnum():
        number = number[1:]  # "7-3": the minus is an operator
    return number


def same_number(prediction: str, answer: str) -> bool:
    """Whether two written numbers are equal (``12`` == ``12.0``); a non-number answer never matches."""
    try:
        return float(prediction) == float(answer)
    except ValueError:
        return False


def last_number_reward(prompts: list[str], completions: list[str], **columns: list[Any]) -> list[float | None]:
    """1.0 when the last number in the completion equals the ``answer`` column, else 0.0 (also with no number).

    Raises:
        KeyError: If there is no ``answer`` column.
    """
    if "answer" not in columns:
        raise KeyError("last_number_reward needs an 'answer' column")
    scores: list[float | None] = []
    for completion, answer in zip(completions, columns["answer"]):
        prediction = last_number(completion)
        scores.append(0.0 if prediction is None else float(same_number(prediction, str(answer))))
    return scores
