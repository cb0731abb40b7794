"""The two shipped environments: ``retry`` arithmetic (reward by the attempt that succeeds) and ``calculator``."""

from __future__ import annotations

import pytest

from lit_fgrpo.environments import ChatTurns, EpisodeDriver, EpisodeLimits, EpisodeStart, load_environment
from lit_fgrpo.environments.calculator import Calculator
from lit_fgrpo.environments.retry import WRONG, RetryArithmetic
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.tasks.arithmetic import ArithmeticSettings, make_arithmetic_splits
from tests.environments.tiny_chat import ScriptedModel, chat_tokenizer, prompt_ids


def questions() -> list[tuple[str, str]]:
    settings = ArithmeticSettings()
    split = make_arithmetic_splits(settings, num_train=4, num_val=0, num_test=0, seed=0)["train"]
    return [(q.text(settings.instruction), str(q.answer)) for q in split]


@pytest.mark.parametrize(("right_at", "reward"), [(1, 1.0), (2, 0.5), (3, 0.25), (None, 0.0)])
def test_retry_rewards_the_attempt_that_succeeds(right_at: int | None, reward: float) -> None:
    env = RetryArithmetic(max_attempts=3)
    question, answer = questions()[0]
    assert env.reset(prompt=question, answer=answer) is None
    wrong = str(int(answer) + 1)
    outcomes = []
    for attempt in range(1, 4):
        outcomes.append(env.step(f"I think {answer if attempt == right_at else wrong}"))
        if outcomes[-1][1]:
            break
    assert outcomes[:-1] == [(WRONG, False)] * (len(outcomes) - 1) and outcomes[-1] == (None, True)
    assert len(outcomes) == (right_at or 3)
    assert env.get_reward() == reward
    assert env.solved == (right_at is not None) and env.first_attempt_right == (right_at == 1)


def test_retry_reads_the_last_number_as_the_single_turn_task_does() -> None:
    env = RetryArithmetic(max_attempts=2)
    env.reset(answer="12")
    assert env.step("7 + 5 = 12")[1] is True and env.get_reward() == 1.0
    env.reset(answer="12")
    assert env.step("12 is 7 + 5") == (WRONG, False)  # the last number is 5


def test_retry_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"^--rollout\.environment_args\.max_attempts must be >= 1, got 0$"):
        RetryArithmetic(max_attempts=0)
    with pytest.raises(ConfigError, match=r"^--rollout\.environment_args\.decay must be in \[0, 1\], got 2$"):
        RetryArithmetic(decay=2)


def test_retry_episodes_on_arithmetic_questions() -> None:
    rows = questions()
    answers = {question: answer for question, answer in rows}

    def script(text: str, turn: int) -> str:  # right on the attempt given by the question's index
        question = next(q for q in answers if q in text)
        index = list(answers).index(question)
        return answers[question] if turn == index else "0"

    factory = load_environment("retry", {"max_attempts": 3})
    driver = EpisodeDriver(factory, ChatTurns(chat_tokenizer()), EpisodeLimits(max_turns=3, max_episode_tokens=512))
    starts = [EpisodeStart(prompt_ids(q), i, {"prompt": q, "answer": a}) for i, (q, a) in enumerate(rows)]
    episodes = driver.run(starts, ScriptedModel(script))
    assert [e.reward for e in episodes] == [1.0, 0.5, 0.25, 0.0]
    assert [e.turns for e in episodes] == [1, 2, 3, 3]
    assert [e.truncated for e in episodes] == [False] * 4  # the third attempt is the last: done, not truncated


def test_calculator_tools_answer_in_whole_numbers_where_they_can() -> None:
    calculator = Calculator()
    calculator.reset(prompt="What is 12 * 7?", answer="84")
    assert (calculator.multiply(12, 7), calculator.add(1.5, 2), calculator.add(2.5, 0.5)) == (84, 3.5, 3)
    assert isinstance(calculator.add(2.5, 0.5), int) and calculator.calls == 4
    factory = load_environment("calculator")
    assert [s["function"]["description"] for s in factory.tool_schemas()] == [
        "Add two numbers.",
        "Multiply two numbers.",
    ]
