"""Group 1: the CLI's error contract: one ``error:`` line (and at most a hint), exit status 2, no traceback.

Most cases call ``lit_fgrpo.cli.main(argv)`` in-process; two run the real console command in a subprocess.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from lit_fgrpo.cli import main
from lit_fgrpo.servers.process import child_environment

TINY: dict[str, Any] = {
    "trainer": {"accelerator": "cpu", "max_steps": 1, "logger": False, "enable_progress_bar": False},
    "model": {
        "policy": {
            "model_config": {
                "model_type": "llama",
                "hidden_size": 16,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
                "intermediate_size": 32,
                "max_position_embeddings": 64,
            },
            "tokenizer": "builtin:maze",
        },
    },
    "data": {
        "source": "maze",
        "splits": {"num_train": 8, "num_val": 2, "num_test": 2, "val_size": 2},
        "loader": {"prompts_per_step": 2},
    },
}


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # anything the CLI writes stays in tmp_path
    monkeypatch.delenv("LIT_FGRPO_DEBUG", raising=False)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The ``error:``/``hint:`` lines of a failing in-process run (asserting status 2 and no traceback)."""
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith(("error:", "hint:"))]
    assert len(lines) in (1, 2) and lines[0].startswith("error:"), err
    return lines


HINT = "hint: run `lit-fgrpo fit --help` for every setting and its type"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--model.objective.gamma", "abc"], ["error: --model.objective.gamma: expected float, got abc", HINT]),
        (["--trainer.max_steps", "x"], ["error: --trainer.max_steps: expected int, got x", HINT]),
        (["--model.nosuch", "3"], ["error: unrecognized arguments: --model.nosuch 3", HINT]),
        (["--model.objective.gamma", "-1"], ["error: --model.objective.gamma must be finite and >= 0, got -1.0"]),
        (["--model.objective.gamma", "nan"], ["error: --model.objective.gamma: expected float, got nan", HINT]),
        (
            ["--model.objective.epsilon", "1.5"],
            [
                "error: --model.objective.epsilon must be in [0, 1], got 1.5 (the ratio's lower clip bound 1 - epsilon would be negative)"
            ],
        ),
        (
            ["--model.optimizer.adam_betas", "[0.9, 1.0]"],
            ["error: --model.optimizer.adam_betas[1] must be in [0, 1), got 1.0"],
        ),
        (["--model.optimizer.lr", "0"], ["error: --model.optimizer.lr must be > 0, got 0.0"]),
    ],
    ids=["gamma_abc", "max_steps_x", "unknown_flag", "gamma_negative", "gamma_nan", "epsilon_1.5", "beta2_1", "lr_0"],
)
def test_bad_flag_values(
    config: Path, capsys: pytest.CaptureFixture[str], flags: list[str], expected: list[str]
) -> None:
    assert run(["fit", "--config", str(config), *flags], capsys) == expected


def test_loss_type_not_a_choice(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (line, _) = run(["fit", "--config", str(config), "--model.objective.loss_type", "foo"], capsys)
    assert line.startswith("error: --model.objective.loss_type: expected one of 'grpo', ") and line.endswith(
        ", got foo"
    )


def test_missing_config_file(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["fit", "--config", "nope.yaml"], capsys) == ["error: --config: no such file: nope.yaml"]


def test_a_config_name_too_long_for_a_file_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    text = repr(TINY)  # a whole config given in place of its file's name: the OS refuses the name
    (line,) = run(["fit", "--config", text], capsys)
    assert line.startswith("error: --config: not a file name (File name too long): {'trainer'")
    assert line.endswith(f"... ({len(text)} characters)")


def test_yaml_syntax_error_names_file_and_line(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config.write_text("model:\n  gamma: 0.5\n  lr: [1e-3\ndata:\n  source: maze\n")
    assert run(["fit", "--config", str(config)], capsys) == [
        f"error: {config}:4: YAML syntax error: expected ',' or ']', but got ':'"
    ]


def test_tab_indented_yaml(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config.write_text("model:\n\tgamma: 0.5\n")
    assert run(["fit", "--config", str(config)], capsys) == [
        f"error: {config}:2: YAML syntax error: found character '\\t' that cannot start any token"
    ]


def test_non_utf8_config(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config.write_bytes(b"model:\n  gamma: 0.5 # \xff\n")
    assert run(["fit", "--config", str(config)], capsys) == [f"error: {config}:2: not UTF-8 text (byte 0xff)"]


def test_missing_interpolation_key_names_file_and_setting(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config.write_text(config.read_text() + "seed_everything: ${model.no_such_key}\n")
    assert run(["fit", "--config", str(config)], capsys) == [
        f"error: {config}: interpolation ${{model.no_such_key}} in seed_everything refers to a missing key"
    ]


def test_missing_data_file(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    words = ["--data.source", "jsonl", "--data.files.train_path", "absent.jsonl"]
    assert run(["fit", "--config", str(config), *words], capsys) == [
        "error: --data.files.train_path does not exist: absent.jsonl"
    ]


@pytest.mark.parametrize(
    ("flags", "sampling", "objective"),
    [
        (["--model.objective.temperature", "0.7"], "1.0", "0.7"),
        (["--rollout.sampling.temperature", "1.5"], "1.5", "1.0"),
    ],
    ids=["objective_only", "sampling_only"],
)
def test_sampling_temperature_other_than_the_objectives_is_refused(
    config: Path, capsys: pytest.CaptureFixture[str], flags: list[str], sampling: str, objective: str
) -> None:
    """The temperature is one fact: the engine's sampling temperature must be the trainer's (one line naming both)."""
    (line,) = run(["fit", "--config", str(config), *flags], capsys)
    assert line.startswith(
        f"error: --rollout.sampling.temperature={sampling} differs from --model.objective.temperature={objective}: "
    )


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"", "checkpoint is empty (0 bytes; an interrupted write?)"), (b"garbage", "not a readable checkpoint")],
    ids=["zero_bytes", "garbage"],
)
def test_unreadable_ckpt_path(config: Path, capsys: pytest.CaptureFixture[str], content: bytes, reason: str) -> None:
    ckpt = config.parent / "last.ckpt"
    ckpt.write_bytes(content)
    (line,) = run(["fit", "--config", str(config), "--ckpt_path", str(ckpt)], capsys)
    assert line.startswith(f"error: {ckpt}: {reason}")


def test_ckpt_of_another_model_shape(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = config.parent / "other.ckpt"
    policy = TINY["model"]["policy"]  # saved flat, as before the settings groups: migrated, then compared
    other = dict(policy, model_config=dict(policy["model_config"], hidden_size=32))
    torch.save({"state_dict": {}, "hyper_parameters": other}, ckpt)
    lines = run(["fit", "--config", str(config), "--ckpt_path", str(ckpt)], capsys)
    assert lines[0].startswith(f"error: {ckpt}: --model.policy.model_config differs from the checkpoint (checkpoint: ")
    assert lines[1] == "hint: resume with the checkpoint's model settings, or start a new run"


def test_debug_shows_the_traceback(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(argparse.ArgumentError):
        main(["fit", "--config", str(config), "--model.objective.gamma", "abc", "--debug"])
    monkeypatch.setenv("LIT_FGRPO_DEBUG", "1")
    with pytest.raises(ValueError, match="--model.objective.gamma must be finite and >= 0"):
        main(["fit", "--config", str(config), "--model.objective.gamma", "-1"])


def test_programming_errors_keep_their_traceback(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr("lit_fgrpo.training.module.NonFiniteGuard", broken)  # built in FGRPOModule.__init__
    with pytest.raises(KeyError, match="a bug"):
        main(["fit", "--config", str(config)])


def console(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = child_environment({"LIT_FGRPO_DEBUG": ""})
    code = "import sys; from lit_fgrpo.cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow  # a fresh interpreter: ~10 s alone, over 30 s on a loaded machine
def test_console_command_exits_2_with_one_line(config: Path) -> None:
    done = console(["fit", "--config", str(config), "--model.objective.gamma", "abc"], config.parent)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-2:] == ["error: --model.objective.gamma: expected float, got abc", HINT]


@pytest.mark.slow
def test_console_bad_data_row_exits_2(config: Path) -> None:
    data = config.parent / "train.jsonl"
    data.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": [1]}\n')
    done = console(
        ["fit", "--config", str(config), "--data.source", "jsonl", "--data.files.train_path", str(data)], config.parent
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-2:] == [
        f"error: {data}:2: field 'answer' must be a string, got list [1]",
        "hint: write the answer as a string (numbers can be converted with --data.files.non_string_answers str; "
        "--data.files.answer_field null: no answer)",
    ]


def test_cli_installs_atomic_checkpoint_writes(config: Path) -> None:
    from lit_fgrpo.cli import cli_main
    from lit_fgrpo.training.checkpointing import AtomicCheckpointIO

    cli = cli_main(["--config", str(config)], run=False)
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
