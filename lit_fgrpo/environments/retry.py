"""``retry``: arithmetic with second chances. A wrong answer is told "Wrong, try again." and may be answered again.

The questions are the ``arithmetic`` source's (:mod:`lit_fgrpo.tasks.arithmetic`: ``What is 13 + 7? Reply with just
the number.``, with its ``answer`` column); a reply is right when its last number equals the answer
(:func:`lit_fgrpo.rewards.last_number.last_number`, the single-turn task's verifier). The episode ends at the first
right reply or after ``max_attempts`` replies.

Reward by the attempt that succeeds: ``decay ** (k - 1)`` for success at attempt ``k`` (1.0, 0.5, 0.25 with the
default ``decay=0.5``), 0.0 when no attempt is right. With the default ``--rollout.correct_threshold 0.5`` the
correctness verdict (mu_hat) is "right within two attempts"; a threshold just above 0 (e.g. 0.01) makes it "right at
some attempt". ``first_attempt_right`` and ``solved`` tell the two apart in evaluations.

Set ``--rollout.max_turns`` to at least ``max_attempts``: fewer turns end the episode truncated before its last try.
"""

from __future__ import annotations

from typing import Any

from lit_fgrpo.environments.base import TextEnvironment
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.rewards.last_number import last_number, same_number

WRONG = "Wrong, try again."


class RetryArithmetic(TextEnvironment):
    """The ``retry`` environment: up to ``max_attempts`` answers to one arithmetic question.

    Args:
        max_attempts: Replies the model may give.
        decay: Reward factor per extra attempt (success at attempt ``k`` scores ``decay ** (k - 1)``).
        feedback: What a wrong reply is told.
    """

    def __init__(self, max_attempts: int = 3, decay: float = 0.5, feedback: str = WRONG) -> None:
        if max_attempts < 1:
            raise ConfigError(f"--rollout.environment_args.max_attempts must be >= 1, got {max_attempts}")
        if not 0 <= decay <= 1:
            raise ConfigError(f"--rollout.environment_args.decay must be in [0, 1], got {decay}")
        self.max_attempts = max_attempts
        self.decay = decay
        self.feedback = feedback
        self.answer = ""
        self.attempts: list[bool] = []
        """Whether each reply so far was right."""

    def reset(self, answer: Any = None, **row: Any) -> None:
        """Start on a question; ``answer`` is its ``answer`` column. The prompt already asks the question."""
        if answer is None:
            raise ValueError("the retry environment needs an 'answer' column")
        self.answer = str(answer)
        self.attempts = []

    def step(self, reply: str) -> tuple[str | None, bool]:
        """Judge a reply: done when it is right or the attempts are used up, else "Wrong, try again."."""
        number = last_number(reply)
        right = number is not None and same_number(number, self.answer)
        self.attempts.append(right)
        if right or len(self.attempts) >= self.max_attempts:
            return None, True
        return self.feedback, False

    @property
    def solved(self) -> bool:
        """Some reply was right."""
        return any(self.attempts)

    @property
    def first_attempt_right(self) -> bool:
        return bool(self.attempts) and self.attempts[0]

    def get_reward(self) -> float:
        """``decay ** (k - 1)`` for success at attempt ``k``, 0.0 without one."""
        return self.decay ** self.attempts.index(True) if self.solved else 0.0
