"""``calculator``: a tool environment with ``add`` and ``multiply``, for arithmetic questions.

The model calls the tools in the plain Hermes format (:mod:`lit_fgrpo.environments.tools`)::

    <tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 7}}</tool_call>

and reads each result back as a tool message; a reply without a tool call ends the episode. It owns no reward: the
final reply is scored by the reward functions (``last_number`` against the ``answer`` column), so a run shows through
``tool_calls/add`` and ``tool_calls/multiply`` whether the tool helped or was never called.
"""

from __future__ import annotations

from typing import Any


def _plain(value: float) -> float | int:
    """A whole number as an int (the model reads ``12``, not ``12.0``)."""
    return int(value) if float(value).is_integer() else value


class Calculator:
    """Two tools, no state beyond a count of the calls it answered."""

    def __init__(self) -> None:
        self.calls = 0

    def reset(self, **row: Any) -> None:
        """A new question; the prompt already asks it."""
        self.calls = 0

    def add(self, a: float, b: float) -> float:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        self.calls += 1
        return _plain(a + b)

    def multiply(self, a: float, b: float) -> float:
        """Multiply two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        self.calls += 1
        return _plain(a * b)
