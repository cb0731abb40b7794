"""TRL-compatible reward functions, failure-tolerant scoring and the correctness verdict."""

from lit_fgrpo.rewards.base import RewardFn, RewardResult, reward_name, run_reward, score_completions
from lit_fgrpo.rewards.math_answer import extract_final_answer, is_equivalent, last_boxed, math_answer_reward
from lit_fgrpo.rewards.maze_reward import maze_reward
from lit_fgrpo.rewards.overlong import OverlongPenalty, overlong_penalty
from lit_fgrpo.rewards.reasoning_gym_reward import (
    ReasoningGymCorrect,
    extract_reasoning_gym_answer,
    reasoning_gym_correct,
    reasoning_gym_reward,
)
from lit_fgrpo.rewards.registry import BUILTIN_REWARD_NAMES, resolve_reward

__all__ = [
    "BUILTIN_REWARD_NAMES",
    "OverlongPenalty",
    "ReasoningGymCorrect",
    "RewardFn",
    "RewardResult",
    "extract_final_answer",
    "extract_reasoning_gym_answer",
    "is_equivalent",
    "last_boxed",
    "math_answer_reward",
    "maze_reward",
    "overlong_penalty",
    "reasoning_gym_correct",
    "reasoning_gym_reward",
    "resolve_reward",
    "reward_name",
    "run_reward",
    "score_completions",
]
