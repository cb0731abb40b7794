"""Every argument the ``fit`` parser knows, given a wrong value, is one ``error:`` line that names it.

The cases come from the parser's own schema (see schema_walk.py): every typed argument of the module, the data module
and the trainer, and every ``__init__`` argument of every callback in the shipped configs. The parser is built once;
each case is parsed (and its classes built, as the CLI does) and the exception is rendered by the CLI's own
:func:`~lit_fgrpo.commands.cli_errors.user_error_message`. A handful of cases go through :func:`lit_fgrpo.cli.main` to show
the same lines come out of the command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from lit_fgrpo.commands.cli_errors import user_error_message
from tests.reliability.schema_walk import argument_cases, callback_cases, shipped_callbacks
from tests.reliability.test_cli_errors import TINY

CALLBACK_CASES = list(callback_cases())


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    from lit_fgrpo.cli import cli_main

    folder = tmp_path_factory.mktemp("schema")
    config = folder / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    cli = cli_main(["--config", str(config)], run=False, parser_kwargs={"exit_on_error": False})
    return cli.parser, config


def error_lines(setup: tuple[Any, Path], words: list[str]) -> list[str] | None:
    """The ``error:``/``hint:`` lines the CLI prints for ``words``; ``None`` when parsing and building succeed."""
    parser, config = setup
    try:
        parsed = parser.parse_args(["--config", str(config), *words])
        parser.instantiate_classes(parsed)
    except Exception as err:
        message = user_error_message(err)
        assert message is not None, f"not reported as a user mistake: {type(err).__name__}: {str(err)[:500]}"
        return message.splitlines()
    return None


def assert_one_line(lines: list[str] | None, must_name: list[str]) -> None:
    assert lines is not None, "the wrong value was accepted"
    assert len(lines) in (1, 2) and lines[0].startswith("error: "), lines
    assert len(lines) == 1 or lines[1].startswith("hint: "), lines
    assert "Union subtypes" not in lines[0] and "Traceback" not in lines[0], lines[0]
    for name in must_name:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"


def test_the_walk_covers_the_shipped_callbacks(setup: tuple[Any, Path]) -> None:
    walked = {name.split(".")[0] for name, _, _ in CALLBACK_CASES}
    assert {path.rsplit(".", 1)[-1] for path in shipped_callbacks()} - walked <= {"RNGStateCallback", "PassAtKReport"}
    assert len(list(argument_cases(setup[0]))) >= 60


def test_every_argument_wrong_type(setup: tuple[Any, Path]) -> None:
    # One test over all arguments (not one per case): the report lists every argument that fails, at once.
    failures = []
    cases = list(argument_cases(setup[0])) + CALLBACK_CASES
    for name, words, must_name in cases:
        try:
            assert_one_line(error_lines(setup, words), must_name)
        except AssertionError as err:
            failures.append(f"{name}: {err}")
    assert not failures, "\n".join(failures)


OUT_OF_RANGE = [
    ("WarmStartCallback", {"steps": -1}, "steps must be >= 0, got -1"),
    ("WarmStartCallback", {"lr": -1.0}, "lr must be finite and > 0, got -1.0"),
    ("SampleTable", {"rows": 0}, "rows=0"),
    ("FocalFigureCallback", {"bins": 0}, "bins must be >= 1, got 0"),
]


ROLLOUT_OUT_OF_RANGE = [
    (["--rollout.sampling.n", "0"], "rollout.sampling.n must be >= 1, got 0"),
    (["--rollout.sampling.n", "1"], "rollout.sampling.n (the group size G) must be >= 2"),
    (["--rollout.sampling.max_tokens", "0"], "rollout.sampling.max_tokens must be >= 1, got 0"),
    (["--rollout.sampling.temperature", "0"], "rollout.sampling.temperature must be > 0"),
    (["--rollout.sampling.top_p", "1.5"], "rollout.sampling.top_p must be in (0, 1]"),
    (["--rollout.reward_weights", "[1.0, 2.0]"], "reward_weights has 2 values"),
    (["--rollout.reward_funcs", "[no_such_reward]"], "unknown reward 'no_such_reward'"),
    (["--rollout.reward_funcs", "[no_such.module:fn]"], "no_such.module:fn"),
    (["--rollout.val_samples", "0"], "val_samples must be >= 1, got 0"),
    (["--rollout.sync_every", "0"], "sync_every must be >= 1, got 0"),
    (["--rollout.max_staleness", "-1"], "max_staleness must be >= 0, got -1"),
    (["--rollout.dynamic_sampling", '{"max_rounds": 0}'], "dynamic_sampling.max_rounds must be >= 1"),
]


@pytest.mark.parametrize(("words", "expected"), ROLLOUT_OUT_OF_RANGE, ids=[c[1][:32] for c in ROLLOUT_OUT_OF_RANGE])
def test_rollout_value_out_of_range(setup: tuple[Any, Path], words: list[str], expected: str) -> None:
    assert_one_line(error_lines(setup, words), ["rollout", expected])


@pytest.mark.parametrize(
    ("owner", "init_args", "expected"), OUT_OF_RANGE, ids=[f"{c[0]}-{c[2][:24]}" for c in OUT_OF_RANGE]
)
def test_callback_value_out_of_range(
    setup: tuple[Any, Path], owner: str, init_args: dict[str, Any], expected: str
) -> None:
    callbacks = [{"class_path": f"lit_fgrpo.callbacks.{owner}", "init_args": init_args}]
    lines = error_lines(setup, ["--trainer.callbacks", json.dumps(callbacks)])
    assert_one_line(lines, ["--trainer.callbacks[0]", f"({owner})", expected])


NUMBERS = (int, float, int | None, float | None)


@pytest.mark.parametrize("value", ["-5", "nan"])
def test_every_number_out_of_range_is_accepted_or_one_line(setup: tuple[Any, Path], value: str) -> None:
    """A negative or NaN number anywhere in model/data is either valid or refused in one line naming the key."""
    from jsonargparse._typehints import ActionTypeHint

    failures = []
    for action in setup[0]._actions:
        if not isinstance(action, ActionTypeHint) or not action.dest.startswith(("model.", "data.")):
            continue
        if action._typehint not in NUMBERS or (value == "nan" and action._typehint in (int, int | None)):
            continue  # jsonargparse itself refuses "nan" for an int, with the key
        lines = error_lines(setup, [f"--{action.dest}", value])
        if lines is not None:
            try:
                group, leaf = action.dest.split(".", 1)
                assert_one_line(lines, [f"--{group}.", leaf])
            except AssertionError as err:
                failures.append(f"{action.dest}={value}: {err}")
    assert not failures, "\n".join(failures)


@pytest.fixture
def tiny_with_callbacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """configs/maze_tiny.yaml as a user edits it: the shipped callback list, one value changed per test."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LIT_FGRPO_DEBUG", raising=False)
    path = tmp_path / "tiny.yaml"
    path.write_text((Path(__file__).resolve().parents[2] / "configs" / "maze_tiny.yaml").read_text())
    return path


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("n: 8 ", "n: 0 ", "error: rollout.sampling.n must be >= 1, got 0"),
        (
            "engine: hf",
            "engine: vlm",
            "error: --rollout.engine: expected one of 'auto', 'vllm', 'hf', 'hf_copy', 'vllm_server', got vlm",
        ),
        (
            "every_n_train_steps: 2",
            "every_n_train_steps: two",
            "error: --trainer.callbacks[5] (ModelCheckpoint): every_n_train_steps: expected int or null, got two",
        ),
    ],
    ids=["group_size_0", "engine_typo", "checkpoint_every_text"],
)
def test_through_the_command(
    tiny_with_callbacks: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, expected: str
) -> None:
    from lit_fgrpo.cli import main

    text = tiny_with_callbacks.read_text()
    assert old in text
    tiny_with_callbacks.write_text(text.replace(old, new, 1))
    assert main(["fit", "--config", str(tiny_with_callbacks)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Union subtypes" not in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [expected]
