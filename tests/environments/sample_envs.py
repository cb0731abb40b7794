"""Environment classes for the loader tests, imported by path (``tests.environments.sample_envs:Mixed``)."""

from __future__ import annotations

from typing import Any

from lit_fgrpo.environments import TextEnvironment

NOT_A_CLASS = "a string"


class Mixed(TextEnvironment):
    """Tools, a step (a text environment's), private helpers, a property and a class attribute."""

    LIMIT = 3

    def __init__(self, scale: int = 1) -> None:
        self.scale = scale

    def reset(self, **row: Any) -> None:
        pass

    def step(self, reply: str) -> tuple[str | None, bool]:
        return None, True

    def get_reward(self) -> float:
        return 1.0

    def look(self, where: str) -> str:
        """Look somewhere.

        Args:
            where: The place.
        """
        return where

    @staticmethod
    def shout(word: str) -> str:
        """Shout a word.

        Args:
            word: The word.
        """
        return word.upper()

    def _helper(self) -> None:
        pass

    @property
    def state(self) -> int:
        return self.scale


class Silent:
    def reset(self, **row: Any) -> None:
        pass

    def _private(self) -> None:
        pass


class NoReset:
    def step(self, reply: str) -> tuple[str | None, bool]:
        return None, True


class BadTool:
    def reset(self, **row: Any) -> None:
        pass

    def go(self, steps):  # type: ignore[no-untyped-def]
        """Go.

        Args:
            steps: How far.
        """
