"""The arithmetic task: answers against Python's own evaluation, disjoint splits, the last-number verifier."""

import pytest

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.rewards.last_number import last_number, last_number_reward
from lit_fgrpo.tasks.arithmetic import ArithmeticQuestion, ArithmeticSettings, make_arithmetic_splits


def test_answers_equal_python_evaluation_with_precedence() -> None:
    settings = ArithmeticSettings(min_value=0, max_value=9, operators=("+", "-", "*"), terms=4)
    splits = make_arithmetic_splits(settings, num_train=300, num_val=20, num_test=20, seed=3)
    for question in (q for split in splits.values() for q in split):
        assert question.answer == eval(question.expression)  # the reference: Python's own precedence


def test_the_pilot_tasks_three_operands_and_sums_with_carries() -> None:
    """The issue-50 pilot's tasks (configs/smollm2/pilot_sum3.yaml, pilot_carry.yaml), each answer summed by a loop."""
    sum3 = ArithmeticSettings(min_value=1, max_value=20, terms=3)
    carry = ArithmeticSettings(min_value=10, max_value=99)
    assert (sum3.universe, carry.universe) == (20**3, 90**2)
    for settings in (sum3, carry):
        splits = make_arithmetic_splits(settings, num_train=1024, num_val=128, num_test=0, seed=0)
        for question in splits["train"] + splits["val"]:
            total = 0
            for value in question.operands:
                total += value
            assert question.answer == total and len(question.operands) == settings.terms
            assert all(settings.min_value <= v <= settings.max_value for v in question.operands)
            assert question.expression == " + ".join(str(v) for v in question.operands)
    # Over the whole universe of carry: the units digits carry in 45 of 100 pairs, the sum reaches 100 in 4,860 of 8,100.
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    assert sum(a % 10 + b % 10 >= 10 for a, b in pairs) / len(pairs) == pytest.approx(0.45)
    assert sum(a + b >= 100 for a, b in pairs) == 4860


def test_splits_are_disjoint_deterministic_and_held_out_stays_put() -> None:
    settings = ArithmeticSettings(max_value=20)
    a = make_arithmetic_splits(settings, num_train=200, num_val=32, num_test=64, seed=0)
    b = make_arithmetic_splits(settings, num_train=250, num_val=32, num_test=64, seed=0)
    assert [len(a[s]) for s in ("train", "val", "test")] == [200, 32, 64]
    assert not set(a["train"]) & set(a["val"]) and not set(a["train"]) & set(a["test"])
    assert not set(a["val"]) & set(a["test"])
    assert a["val"] == b["val"] and a["test"] == b["test"]  # more training questions leave the held-out ones
    assert a["train"] == b["train"][:200]
    assert make_arithmetic_splits(settings, 200, 32, 64, seed=1)["val"] != a["val"]


def test_universe_and_bad_settings_are_one_line_errors() -> None:
    assert ArithmeticSettings(min_value=1, max_value=20).universe == 400
    with pytest.raises(ConfigError, match=r"--data.splits.num_train \+ num_val \+ num_test = 401 exceeds the 400"):
        make_arithmetic_splits(ArithmeticSettings(), 400, 1, 0, seed=0)
    with pytest.raises(ConfigError, match="--data.arithmetic.operators"):
        ArithmeticSettings(operators=("/",))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--data.arithmetic.max_value must be >= min_value"):
        ArithmeticSettings(min_value=5, max_value=4)
    with pytest.raises(ConfigError, match="--data.arithmetic.terms"):
        ArithmeticSettings(terms=1)


def test_question_text() -> None:
    question = ArithmeticQuestion(operands=(13, 7), operators=("+",))
    assert question.text("Reply with just the number.") == "What is 13 + 7? Reply with just the number."
    assert question.text("") == "What is 13 + 7?"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 12.", "12"),
        ("7 + 5 = 12", "12"),
        ("7 + 5", "5"),
        ("12\n\nI hope this helps", "12"),
        ("It is -3.", "-3"),
        ("7 - 3", "3"),
        ("7-3", "3"),
        ("1,024 apples", "1024"),
        ("2.50", "2.50"),
        ("no digits", None),
    ],
)
def test_last_number(text: str, expected: str | None) -> None:
    assert last_number(text) == expected


def test_last_number_reward() -> None:
    completions = ["13 + 7 = 20", "20.0", "The sum is 21", "twenty", "20 is wrong, it is 19"]
    scores = last_number_reward(["p"] * 5, completions, answer=["20"] * 5)
    assert scores == [1.0, 1.0, 0.0, 0.0, 0.0]
    with pytest.raises(KeyError, match="answer"):
        last_number_reward(["p"], ["1"])
