"""Reward functions: math-verify answers, failure handling, weights, correctness threshold, overlong penalty."""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

import pytest
import torch

from lit_fgrpo.rewards import (
    extract_final_answer,
    math_answer_reward,
    maze_reward,
    overlong_penalty,
    reasoning_gym_correct,
    reasoning_gym_reward,
    resolve_reward,
    score_completions,
)

MATH_CASES = [
    ("so the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("first \\boxed{3}, no wait: \\boxed{4}", "4", 1.0),
    ("first \\boxed{3}, no wait: \\boxed{4}", "3", 0.0),
    ("\\boxed{\\frac{\\sqrt{8}}{2}}", "\\sqrt{2}", 1.0),  # nested braces
    ("\\boxed{\\boxed{7}}", "7", 1.0),  # nested boxes
    ("<answer>3</answer>", "3", 1.0),
    ("<answer>2\\sqrt{2}</answer>", "\\sqrt{8}", 1.0),
    ("the answer is 5", "5", 0.0),  # no box, no tag
    ("\\boxed{x^2+1}", "1+x^2", 1.0),
    ("\\boxed{6}", "5", 0.0),
    ("\\boxed{unclosed", "5", 0.0),
]


@pytest.mark.parametrize(("completion", "answer", "expected"), MATH_CASES)
def test_math_answer_reward(completion: str, answer: str, expected: float) -> None:
    assert math_answer_reward(["q"], [completion], answer=[answer]) == [expected]


def test_extract_final_answer_nested() -> None:
    assert extract_final_answer("x \\boxed{\\frac{a}{\\{b\\}}} y") == "\\frac{a}{\\{b\\}}"
    assert extract_final_answer("no answer") is None


def test_math_reward_in_worker_thread() -> None:
    results: list[Any] = []
    thread = threading.Thread(
        target=lambda: results.append(
            math_answer_reward(["q"] * 2, ["\\boxed{1/2}", "\\boxed{2}"], answer=["0.5", "3"])
        )
    )
    thread.start()
    thread.join()
    assert results == [[1.0, 0.0]]


def fails_on_bad(prompts: list[str], completions: list[str], **columns: list[Any]) -> list[float | None]:
    if any(c == "bad" for c in completions):
        raise RuntimeError("cannot score 'bad'")
    return [1.0 for _ in completions]


def half(prompts: list[str], completions: list[str], **columns: list[Any]) -> list[float | None]:
    return [0.5 if c != "none" else None for c in completions]


def test_raising_reward_gives_none_only_for_failing_rows(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        result = score_completions(["p"] * 3, ["ok", "bad", "ok"], {}, [fails_on_bad], correctness_fn=fails_on_bad)
    values = result.per_function["fails_on_bad"]
    assert values[0] == 1.0 and math.isnan(values[1]) and values[2] == 1.0
    assert result.num_failed == {"fails_on_bad": 1}
    assert result.correct.tolist() == [True, False, True] and result.num_unjudged == 1
    assert "fails_on_bad" in caplog.text and "cannot score 'bad'" in caplog.text


def test_weights_and_nan_when_all_none() -> None:
    result = score_completions(
        ["p"] * 3, ["ok", "bad", "none"], {"answer": ["a", "b", "c"]}, [fails_on_bad, half], weights=[2.0, -1.0]
    )
    assert result.rewards[0] == pytest.approx(1.5)  # 2*1 - 0.5
    assert result.rewards[1] == pytest.approx(-0.5)  # fails_on_bad None is skipped
    assert result.rewards[2] == pytest.approx(2.0)  # half's None is skipped
    all_none = score_completions(["p"], ["bad"], {}, [fails_on_bad, fails_on_bad])
    assert math.isnan(all_none.rewards[0]) and set(all_none.per_function) == {"fails_on_bad", "fails_on_bad#2"}
    assert not all_none.correct[0]  # judged by the total reward, which is NaN


def test_length_mismatch_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match="column 'answer' has 1 rows, expected 2"):
        score_completions(["p", "q"], ["a", "b"], {"answer": ["x"]}, [half])


def drops_last(prompts: list[str], completions: list[str], **columns: list[Any]) -> list[float | None]:
    """A buggy reward: one value too few for a batch of two or more (right for a single row)."""
    values: list[float | None] = [float(len(c)) for c in completions]
    return values[:-1] if len(values) > 1 else values


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_wrong_number_of_values_is_warned_counted_and_scored_row_by_row(
    isolation: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        result = score_completions(["p"] * 3, ["a", "bb", "ccc"], {}, [drops_last], reward_isolation=isolation)  # type: ignore[arg-type]
    assert result.per_function["drops_last"].tolist() == [1.0, 2.0, 3.0]  # each row scored alone
    assert result.num_wrong_length == {"drops_last": 1} and result.num_failed == {"drops_last": 0}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "reward 'drops_last' returned 2 values for 3 completions (it must return one value per completion): "
        "scoring this batch row by row"
    ]


def test_threshold_correctness_with_countdown_like_scores() -> None:
    def countdown_like(prompts: list[str], completions: list[str], **columns: list[Any]) -> list[float | None]:
        return [1.0 if c == "right" else 0.01 for c in completions]

    result = score_completions(["p"] * 2, ["right", "wrong"], {}, [countdown_like], correctness_fn=countdown_like)
    assert result.correct.tolist() == [True, False] and result.rewards.tolist() == pytest.approx([1.0, 0.01])


def test_reasoning_gym_scorer_and_threshold() -> None:
    reasoning_gym = pytest.importorskip("reasoning_gym")
    entry = reasoning_gym.create_dataset("countdown", seed=1, size=1)[0]
    completions = [f"<answer>{entry['answer']}</answer>", "<answer>1+1</answer>", "no idea"]
    columns = {"entry": [entry] * 3}
    scores = reasoning_gym_reward(["p"] * 3, completions, **columns)
    assert scores[0] == 1.0 and 0 < scores[1] < 0.5 and 0 < scores[2] < 0.5
    result = score_completions(
        ["p"] * 3, completions, columns, [reasoning_gym_reward], correctness_fn=reasoning_gym_correct()
    )
    assert result.correct.tolist() == [True, False, False]


def test_overlong_penalty_matches_closed_form() -> None:
    lmax, cache = 20, 4
    fn = overlong_penalty(lmax, cache)
    lengths = [0, 15, 16, 17, 18, 20, 21, 100]
    expected = [0.0 if n <= lmax - cache else ((lmax - cache) - n) / cache if n <= lmax else -1.0 for n in lengths]
    assert fn([""] * 8, [""] * 8, completion_length=lengths) == pytest.approx(expected)
    assert expected[2:6] == [0.0, -0.25, -0.5, -1.0]
    assert overlong_penalty(20, 4, factor=0.5)([""], [""], completion_length=[21]) == [-0.5]
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(20, 0)


def test_maze_reward() -> None:
    from lit_fgrpo.tasks.maze import MazeConfig, make_maze_splits, maze_prompt_tokens, maze_target_tokens

    maze = make_maze_splits(MazeConfig(3, 3), 1, 0, 0, seed=0)["train"][0]
    prompt = " ".join(maze_prompt_tokens(maze))
    right = " ".join(maze_target_tokens(maze))
    assert maze_reward([prompt] * 3, [right, "DONE", right.replace("DONE", "UP DONE")]) == [1.0, 0.0, 0.0]


def test_resolve_reward() -> None:
    assert resolve_reward("math_answer") is math_answer_reward
    assert resolve_reward("lit_fgrpo.rewards.maze_reward:maze_reward") is maze_reward
    assert resolve_reward("lit_fgrpo.rewards.maze_reward.maze_reward") is maze_reward
    assert resolve_reward(half) is half
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        resolve_reward("nope")
    with pytest.raises(ValueError, match="cannot import reward"):
        resolve_reward("lit_fgrpo.rewards.no_module:x")


def test_result_dtypes() -> None:
    result = score_completions(
        ["p"], ["\\boxed{2}"], {"answer": ["2"]}, [math_answer_reward], correctness_fn=math_answer_reward
    )
    assert result.rewards.dtype == torch.float32 and result.correct.dtype == torch.bool and result.correct.item()
