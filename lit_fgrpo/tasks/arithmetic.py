"""Arithmetic questions for a small instruct model, generated offline with disjoint held-out splits.

``What is 13 + 7? Reply with just the number.`` The difficulty is set by :class:`ArithmeticSettings` (operand range,
operators, terms per question). Every question of the universe is drawn at most once across the splits, so the
validation and test questions never appear in training; the splits depend only on the settings and the seed.

The verifier is :func:`lit_fgrpo.rewards.last_number.last_number_reward`: the last number in the reply must equal
the answer, so a reply that restates the question and then answers ("7 + 5 = 12") is right, and one that stops after
restating it is wrong.
"""

from __future__ import annotations

import operator
import random
from dataclasses import dataclass
from typing import Literal, get_args

from lit_fgrpo.errors import ConfigError

Operator = Literal["+", "-", "*"]
_APPLY = {"+": operator.add, "-": operator.sub, "*": operator.mul}


@dataclass(frozen=True)
class ArithmeticSettings:
    """The ``arithmetic`` source's questions (``--data.arithmetic.max_value 50``)."""

    min_value: int = 1
    """Smallest operand."""
    max_value: int = 20
    """Largest operand."""
    operators: tuple[Operator, ...] = ("+",)
    """Operators drawn uniformly for each gap between terms (``+``, ``-``, ``*``)."""
    terms: int = 2
    """Operands per question (2 = ``a + b``)."""
    instruction: str = "Reply with just the number."
    """Sentence after the question ("" for none)."""

    def __post_init__(self) -> None:
        flag = "--data.arithmetic"
        if self.max_value < self.min_value:
            raise ConfigError(f"{flag}.max_value must be >= min_value ({self.min_value}), got {self.max_value}")
        if self.terms < 2:
            raise ConfigError(f"{flag}.terms must be >= 2, got {self.terms}")
        ops = tuple(self.operators)
        if not ops or any(op not in get_args(Operator) for op in ops):
            raise ConfigError(
                f"{flag}.operators must be a non-empty list of {list(get_args(Operator))}, got {list(ops)}"
            )
        object.__setattr__(self, "operators", ops)  # a YAML list as the tuple the dataclass declares

    @property
    def universe(self) -> int:
        """How many distinct questions the settings allow."""
        span = self.max_value - self.min_value + 1
        return span**self.terms * len(set(self.operators)) ** (self.terms - 1)


@dataclass(frozen=True)
class ArithmeticQuestion:
    """One question: its operands and operators, the text and the integer answer."""

    operands: tuple[int, ...]
    operators: tuple[str, ...]

    @property
    def expression(self) -> str:
        """``13 + 7 * 2`` (evaluated with the usual precedence)."""
        words = [str(self.operands[0])]
        for op, value in zip(self.operators, self.operands[1:]):
            words += [op, str(value)]
        return " ".join(words)

    @property
    def answer(self) -> int:
        """The value of :attr:`expression`, ``*`` before ``+`` and ``-``."""
        sums = [self.operands[0]]  # terms of the sum; a * folds into the last one
        signs = [1]
        for op, value in zip(self.operators, self.operands[1:]):
            if op == "*":
                sums[-1] = _APPLY["*"](sums[-1], value)
            else:
                sums.append(value)
                signs.append(1 if op == "+" else -1)
        return sum(sign * term for sign, term in zip(signs, sums))

    def text(self, instruction: str) -> str:
        """The user turn: ``What is 13 + 7? Reply with just the number.``"""
        return f"What is {self.expression}?" + (f" {instruction}" if instruction else "")


def make_arithmetic_splits(
    settings: ArithmeticSettings, num_train: int, num_val: int, num_test: int, seed: int
) -> dict[str, list[ArithmeticQuestion]]:
    """Disjoint train / val / test questions, drawn without replacement from the settings' universe.

    Raises:
        ConfigError: If the universe is smaller than the three splits together.
    """
    wanted = num_train + num_val + num_test
    if wanted > settings.universe:
        raise ConfigError(
            f"--data.splits.num_train + num_val + num_test = {wanted} exceeds the {settings.universe} distinct arithmetic "
            "questions of --data.arithmetic; widen the operand range or ask for fewer"
        )
    rng = random.Random(seed)
    seen: set[ArithmeticQuestion] = set()
    drawn: list[ArithmeticQuestion] = []
    values = range(settings.min_value, settings.max_value + 1)
    while len(drawn) < wanted:
        question = ArithmeticQuestion(
            operands=tuple(rng.choice(values) for _ in range(settings.terms)),
            operators=tuple(rng.choice(settings.operators) for _ in range(settings.terms - 1)),
        )
        if question not in seen:
            seen.add(question)
            drawn.append(question)
    # Held-out splits first, so that the val and test questions do not move when num_train changes.
    return {
        "val": drawn[:num_val],
        "test": drawn[num_val : num_val + num_test],
        "train": drawn[num_val + num_test :],
    }
