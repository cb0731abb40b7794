"""Math answers graded by math-verify: the last ``\\boxed{...}`` (or ``<answer>...</answer>``) against ``answer``."""

from __future__ import annotations

import re
import threading
from functools import lru_cache
from typing import Any

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED_OPENERS = ("\\boxed{", "\\fbox{")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, nested braces included.

    Returns ``None`` when there is none or its braces never close.
    """
    start = max(text.rfind(opener) + len(opener) if opener in text else -1 for opener in _BOXED_OPENERS)
    if start < 0:
        return None
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def extract_final_answer(completion: str) -> str | None:
    """The final answer: the last boxed expression, else the content of the last ``<answer>`` tag, else ``None``."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed.strip()
    tags = _ANSWER_TAG.findall(completion)
    return tags[-1].strip() if tags else None


def _timeouts() -> dict[str, Any]:
    """math-verify times out with ``signal.alarm``, which only works in the main thread."""
    if threading.current_thread() is threading.main_thread():
        return {}
    return {"parsing_timeout": None, "timeout_seconds": None}


def _as_latex(text: str) -> str:
    return text if ("\\boxed" in text or "$" in text) else f"\\boxed{{{text}}}"


@lru_cache(maxsize=16384)
def _parse_gold(answer: str, in_main_thread: bool) -> list[Any]:
    from math_verify import parse

    return list(parse(_as_latex(answer), **({} if in_main_thread else {"parsing_timeout": None})))


def is_equivalent(prediction: str, answer: str) -> bool:
    """Whether math-verify judges ``prediction`` (already extracted) equal to the reference ``answer``."""
    from math_verify import parse, verify

    timeouts = _timeouts()
    gold = _parse_gold(str(answer), not timeouts)
    if not gold:
        raise ValueError(f"math-verify cannot parse the reference answer {answer!r}")
    parsed = parse(f"\\boxed{{{prediction}}}", **{k: v for k, v in timeouts.items() if k == "parsing_timeout"})
    if not parsed:
        return False
    return bool(verify(gold, parsed, **{k: v for k, v in timeouts.items() if k == "timeout_seconds"}))


def math_answer_reward(prompts: list[str], completions: list[str], **columns: list[Any]) -> list[float | None]:
    """1.0 when the completion's final answer equals the ``answer`` column under math-verify, else 0.0.

    The final answer is the last ``\\boxed{...}`` (nested braces allowed), else the last ``<answer>...</answer>``;
    a completion with neither scores 0.0. Safe to call from worker threads (math-verify's signal-based timeouts
    are switched off there).

    Raises:
        KeyError: If there is no ``answer`` column.
        ValueError: If a reference answer cannot be parsed (the row then scores ``None`` in ``score_completions``).
    """
    if "answer" not in columns:
        raise KeyError("math_answer_reward needs an 'answer' column")
    scores: list[float | None] = []
    for completion, answer in zip(completions, columns["answer"]):
        prediction = extract_final_answer(completion)
        scores.append(0.0 if prediction is None else float(is_equivalent(prediction, str(answer))))
    return scores
