"""Environment classes written the way TRL's ``environment_factory`` docstring (``trl/trainer/grpo_trainer.py``, trl
1.16) describes them: ``reset(**kwargs) -> str | None``, public methods with type hints and Google docstrings as
tools, an optional ``get_reward() -> float``; nothing of ours is imported. Shapes only, no TRL code.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np


class IncrementEnv:
    """TRL's counter example: the row's ``start`` column (an int) and ``target`` set the task."""

    def __init__(self) -> None:
        self.counter = 0
        self.target = 0
        self.resets = 0

    def reset(self, **kwargs: Any) -> str | None:
        self.resets += 1
        self.counter = kwargs["start"]  # an int: a string here would never equal the target
        self.target = kwargs["target"]
        return None

    def increment(self, step: int) -> int:
        """Increment the counter.

        Args:
            step: How much to add.
        """
        self.counter += step
        return self.counter

    def get_reward(self) -> float:
        return 1.0 if self.counter == self.target else 0.0


class OwnDataEnv:
    """An environment that owns its data: ``reset`` gives the prompt, no dataset."""

    def __init__(self) -> None:
        self.secret = 0

    def reset(self, **kwargs: Any) -> str:
        self.secret = 7
        return "Guess the secret number by calling guess."

    def guess(self, number: int) -> str:
        """Guess the number.

        Args:
            number: The guess.
        """
        return "right" if number == self.secret else "wrong"

    def get_reward(self) -> float:
        return 1.0


class AsyncEnv:
    """Async tools, ``reset`` and ``get_reward`` (an LLM judge would be async)."""

    def __init__(self) -> None:
        self.total = 0

    async def reset(self, **kwargs: Any) -> str | None:
        await asyncio.sleep(0)
        self.total = 0
        return None

    async def add(self, a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: The first.
            b: The second.
        """
        await asyncio.sleep(0)
        self.total = a + b
        return a + b

    async def get_reward(self) -> float:
        return float(self.total)


class GameEnv:
    """A game whose move tool is called ``step`` (only ``reset`` and ``get_reward`` are reserved in TRL)."""

    def reset(self, **kwargs: Any) -> str | None:
        self.position = 0
        return None

    def step(self, direction: str) -> str:
        """Move one square.

        Args:
            direction: left or right.
        """
        self.position += 1 if direction == "right" else -1
        return f"position {self.position}"

    def get_reward(self) -> np.bool_:
        return np.True_  # numpy's bool, as a comparison of arrays gives it


class DivideEnv:
    """A tool that raises on the model's bad arguments (TRL shows the model ``{"error": ...}``)."""

    def reset(self, **kwargs: Any) -> None:
        self.errors = 0

    def divide(self, a: float, b: float) -> float:
        """Divide a by b.

        Args:
            a: Numerator.
            b: Denominator.
        """
        return a / b

    def get_reward(self) -> bool:
        return True


class ThreadBoundEnv:
    """State bound to the thread that made it in ``reset`` (as a sqlite connection is)."""

    def reset(self, **kwargs: Any) -> None:
        self.owner = threading.get_ident()

    def check(self, x: int) -> str:
        """Check the thread.

        Args:
            x: Anything.
        """
        if threading.get_ident() != self.owner:
            raise RuntimeError("used from another thread")
        return "same thread"


class SlowToolEnv:
    """A tool that hangs (a network call that never answers)."""

    def reset(self, **kwargs: Any) -> None:
        return None

    def wait(self, seconds: float) -> str:
        """Wait.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)
        return "done"


def shout(text: str) -> str:
    """Shout the text (a standalone tool, TRL's ``tools=[...]``).

    Args:
        text: What to shout.
    """
    return text.upper()
