"""Reward functions by name: the built-in ones, or any ``package.module:attr`` path (TRL's ``reward_funcs`` as
strings, as configs write them).
"""

from __future__ import annotations

import importlib
from typing import Any

from lit_fgrpo.rewards.base import RewardFn

BUILTIN_REWARDS = {
    "last_number": "lit_fgrpo.rewards.last_number:last_number_reward",
    "math_answer": "lit_fgrpo.rewards.math_answer:math_answer_reward",
    "maze": "lit_fgrpo.rewards.maze_reward:maze_reward",
    "reasoning_gym": "lit_fgrpo.rewards.reasoning_gym_reward:reasoning_gym_reward",
    "reasoning_gym_correct": "lit_fgrpo.rewards.reasoning_gym_reward:ReasoningGymCorrect",
}
"""Built-in name -> the path it stands for (imported on first use: math-verify and reasoning-gym are heavy)."""

BUILTIN_REWARD_NAMES = tuple(BUILTIN_REWARDS)
"""Names :func:`resolve_reward` knows without a module path."""


def resolve_reward(name_or_path: str | RewardFn) -> RewardFn:
    """A reward function by built-in name (:data:`BUILTIN_REWARD_NAMES`) or ``package.module:attr`` /
    ``package.module.attr`` path. A class found by path is instantiated without arguments; a callable passes through.

    Raises:
        ValueError: If the name is unknown, the path cannot be imported, or the object is not callable.
    """
    if not isinstance(name_or_path, str):
        return name_or_path
    path = BUILTIN_REWARDS.get(name_or_path, name_or_path)
    module_name, sep, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not sep or not module_name or not attr:
        raise ValueError(f"unknown reward {name_or_path!r}: use one of {BUILTIN_REWARD_NAMES} or 'package.module:name'")
    try:
        obj: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot import reward {name_or_path!r}: {err}") from None
    if isinstance(obj, type):
        obj = obj()
    if not callable(obj):
        raise ValueError(f"reward {name_or_path!r} is not callable")
    return obj  # type: ignore[no-any-return]
