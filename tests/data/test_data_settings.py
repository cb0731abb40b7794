"""PromptDataModule's settings groups: one line naming the full flag per bad value, plain hyperparameters, and
checkpoints from before the groups (flat data settings) still load and resume exactly."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

import pytest
import torch

from lit_fgrpo.data import PromptDataModule
from lit_fgrpo.data.data_settings import (
    TOP_LEVEL,
    LoaderSettings,
    SplitSettings,
    flat_names,
    grouped_data_settings,
    new_flag,
    settings_groups,
)
from lit_fgrpo.errors import ConfigError, UserError
from lit_fgrpo.tasks import MazeConfig
from lit_fgrpo.training.checkpointing import resolve_resume
from tests.data.test_datamodule import fit

FLAT_HPARAMS: dict[str, Any] = {
    "source": "maze", "train_path": None, "val_path": None, "test_path": None, "prompt_field": "prompt",
    "answer_field": "answer", "system_prompt": None, "reasoning_gym_name": None, "dataset_size": 1000,
    "maze_rows": 3, "maze_cols": 4, "maze_newline_tokens": True, "maze_border_walls": False,
    "arithmetic": {"min_value": 1, "max_value": 20, "operators": ("+",), "terms": 2,
                   "instruction": "Reply with just the number."},
    "num_train": 7, "num_val": 2, "num_test": 2, "prompts_per_step": 3, "val_batch_size": None,
    "max_prompt_length": 512, "too_long": "skip", "seed": 5, "num_workers": 0, "val_size": 64,
    "tokenizer_path": None, "non_string_answers": "error",
    "_instantiator": "lightning.pytorch.cli.instantiate_module", "_class_path": "lit_fgrpo.data.PromptDataModule",
}  # fmt: skip
"""A checkpoint's ``datamodule_hyper_parameters`` as PromptDataModule and LightningCLI wrote them before the groups."""

NEWER_GROUPS = {"environment_rows"}
"""Groups added after the flat settings (an old checkpoint has none of their settings: they keep their defaults)."""

GROUPED = dict(
    source="maze",
    maze=MazeConfig(rows=3, cols=4, border_walls=False),
    splits=SplitSettings(num_train=7, num_val=2, num_test=2),
    loader=LoaderSettings(prompts_per_step=3),
    seed=5,
)
"""The same settings, grouped."""


# ------------------------------------------------------------------------------------ one line naming the full flag


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"files": {"prompt_field": ""}}, "--data.files.prompt_field must be a non-empty string, got ''"),
        ({"files": {"answer_field": ""}}, "--data.files.answer_field must be a non-empty string, got ''"),
        ({"environment_rows": {"val_size": -1}}, "--data.environment_rows.val_size must be >= 0, got -1"),
        ({"environment_rows": {"test_size": 1.5}}, "--data.environment_rows.test_size: expected an int, got 1.5"),
        ({"environment_rows": {"size": 1}}, "--data.environment_rows.size is not a setting; the settings are val_size"),
        ({"files": {"non_string_answers": "float"}}, "--data.files.non_string_answers must be one of ('error', 'str')"),
        ({"files": {"train_path": 3}}, "--data.files.train_path must be a non-empty string, got 3"),
        ({"maze": {"rows": 0}}, "--data.maze.rows must be >= 1, got 0"),
        ({"maze": {"cols": -2}}, "--data.maze.cols must be >= 1, got -2"),
        ({"maze": {"rows": 1, "cols": 1}}, "--data.maze.rows x cols must give at least two cells"),
        ({"maze": {"rows": 2.5}}, "--data.maze.rows: expected an int, got 2.5"),
        ({"maze": {"newline_tokens": "yes"}}, "--data.maze.newline_tokens: expected true or false, got 'yes'"),
        ({"arithmetic": {"terms": 1}}, "--data.arithmetic.terms must be >= 2, got 1"),
        ({"reasoning_gym": {"dataset_size": 0}}, "--data.reasoning_gym.dataset_size must be >= 1, got 0"),
        ({"reasoning_gym": {"name": ""}}, "--data.reasoning_gym.name must be a non-empty string"),
        ({"splits": {"num_train": 0}}, "--data.splits.num_train must be >= 1, got 0"),
        ({"splits": {"num_val": -1}}, "--data.splits.num_val must be >= 0, got -1"),
        ({"splits": {"num_test": -1}}, "--data.splits.num_test must be >= 0, got -1"),
        ({"splits": {"val_size": -3}}, "--data.splits.val_size must be >= 0, got -3"),
        ({"splits": {"num_train": True}}, "--data.splits.num_train: expected an int, got True"),
        ({"prompts": {"max_length": 0}}, "--data.prompts.max_length must be >= 1, got 0"),
        ({"prompts": {"too_long": "wrap"}}, "--data.prompts.too_long must be one of"),
        ({"prompts": {"system_prompt": 3}}, "--data.prompts.system_prompt: expected a string, got 3"),
        ({"loader": {"prompts_per_step": 0}}, "--data.loader.prompts_per_step must be >= 1, got 0"),
        ({"loader": {"val_batch_size": 0}}, "--data.loader.val_batch_size must be >= 1, got 0"),
        ({"loader": {"num_workers": -1}}, "--data.loader.num_workers must be >= 0, got -1"),
        ({"loader": {"prompts": 4}}, "--data.loader.prompts is not a setting; the settings are prompts_per_step"),
        ({"maze": 3}, "--data.maze: expected a mapping of MazeConfig fields, got 3"),
        ({"mazes": {"rows": 3}}, "--data.mazes is not a setting of PromptDataModule (nor a registered task: maze, "),
        ({"source": "csv"}, "--data.source must be one of"),
        ({"seed": "x"}, "--data.seed: expected an int, got 'x'"),
        ({"source": "parquet"}, "--data.files.train_path is required with --data.source parquet"),
        ({"source": "reasoning_gym"}, "--data.reasoning_gym.name is required with --data.source reasoning_gym"),
    ],
)
def test_bad_value_is_one_line_naming_the_full_flag(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        PromptDataModule(**kwargs)
    assert str(caught.value).startswith(named) and "\n" not in str(caught.value)


def test_missing_paths_are_data_errors_naming_the_flag(tmp_path: Path) -> None:
    train = tmp_path / "train.jsonl"
    train.write_text('{"prompt": "a", "answer": "1"}\n')
    for name in ("train_path", "val_path", "test_path"):
        files = {"train_path": str(train)} | {name: str(tmp_path / "absent.jsonl")}
        with pytest.raises(UserError, match=rf"^--data.files.{name} does not exist: .*absent.jsonl$"):
            PromptDataModule(source="jsonl", files=files)
    with pytest.raises(UserError, match="^--data.tokenizer_path does not exist: /no/such$"):
        PromptDataModule(tokenizer_path="/no/such")


def test_held_out_rows_beyond_the_file_name_the_flag(tmp_path: Path) -> None:
    train = tmp_path / "train.jsonl"
    train.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": "2"}\n')
    dm = PromptDataModule(source="jsonl", files={"train_path": str(train)}, tokenizer_path="builtin:maze")
    with pytest.raises(UserError, match=r"^--data.splits.val_size=64 leaves no training rows of 2 in "):
        dm.setup("fit")


# ------------------------------------------------------------------------------------------------- hyperparameters


def test_no_setting_shares_a_name_with_the_modules() -> None:
    """Loggers get the module's and the data module's hyperparameters merged; Lightning refuses a shared key."""
    from lit_fgrpo.training.module_settings import GROUPS as MODULE_GROUPS

    assert not (set(settings_groups()) | set(TOP_LEVEL)) & (set(MODULE_GROUPS) | {"val_pass_at_k"})


def test_hyperparameters_are_plain_and_rebuild_the_data_module() -> None:
    dm = PromptDataModule(**GROUPED)
    buffer = io.BytesIO()
    torch.save({"datamodule_hyper_parameters": dict(dm.hparams)}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)["datamodule_hyper_parameters"]  # Lightning's resume load
    assert set(saved) == set(settings_groups()) | set(TOP_LEVEL)
    assert saved["maze"] == {"rows": 3, "cols": 4, "newline_tokens": True, "border_walls": False}
    rebuilt = PromptDataModule(**saved)
    assert rebuilt.hparams == dm.hparams and rebuilt.task_settings == dm.task_settings and rebuilt.loader == dm.loader


# --------------------------------------------------------------------------------- checkpoints from before the groups


def test_every_old_flat_setting_has_one_group() -> None:
    assert set(FLAT_HPARAMS) - set(flat_names()) == {*TOP_LEVEL, "arithmetic", "_instantiator", "_class_path"}
    grouped = grouped_data_settings(FLAT_HPARAMS)
    older = {name: cls for name, cls in settings_groups().items() if name not in NEWER_GROUPS}
    assert set(grouped) == set(older) | set(TOP_LEVEL)
    for group, cls in older.items():  # every field of every group of then comes from the old settings
        assert set(grouped[group]) == {f.name for f in dataclasses.fields(cls)}, group
    assert grouped["maze"] == {"rows": 3, "cols": 4, "newline_tokens": True, "border_walls": False}
    assert grouped["prompts"]["max_length"] == 512 and grouped["reasoning_gym"]["name"] is None
    assert new_flag("maze_rows") == "--data.maze.rows" and new_flag("max_prompt_length") == "--data.prompts.max_length"
    assert new_flag("no_such") is None
    with pytest.raises(ConfigError, match=r"^--data.no_such is not a setting of PromptDataModule"):
        grouped_data_settings({"no_such": 1})


def test_flat_and_grouped_settings_merge() -> None:
    grouped = grouped_data_settings({"num_train": 9, "splits": {"num_val": 1}, "loader": LoaderSettings()})
    assert grouped == {"splits": {"num_val": 1, "num_train": 9}, "loader": dataclasses.asdict(LoaderSettings())}


def flat_checkpoint(tmp_path: Path, steps: int) -> tuple[Path, PromptDataModule]:
    """A checkpoint after ``steps`` training steps, its data settings rewritten flat as before the groups."""
    trainer, _ = fit(PromptDataModule(**GROUPED), steps, tmp_path)
    path = tmp_path / "grouped.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["datamodule_hyper_parameters"]["splits"]["num_train"] == 7  # written grouped now
    checkpoint["datamodule_hyper_parameters"] = dict(FLAT_HPARAMS)
    old = tmp_path / "old.ckpt"
    torch.save(checkpoint, old)
    return old, trainer.datamodule


@pytest.mark.parametrize("where", ["file", "buffer"])
def test_flat_checkpoint_loads_into_the_groups(tmp_path: Path, where: str) -> None:
    path, trained = flat_checkpoint(tmp_path, 2)
    source: Any = path if where == "file" else io.BytesIO(path.read_bytes())
    loaded = PromptDataModule.load_from_checkpoint(source)
    assert loaded.hparams == PromptDataModule(**GROUPED).hparams
    assert loaded.task_settings["maze"] == GROUPED["maze"] and loaded.split_settings == GROUPED["splits"]
    assert loaded.seed == 5 and loaded.state_dict() == trained.state_dict()  # the stream's resume point came along


def test_grouped_checkpoint_loads_as_it_is(tmp_path: Path) -> None:
    trainer, _ = fit(PromptDataModule(**GROUPED), 1, tmp_path)
    path = tmp_path / "new.ckpt"
    trainer.save_checkpoint(path)
    loaded = PromptDataModule.load_from_checkpoint(path)
    assert loaded.hparams == trainer.datamodule.hparams and loaded.state_dict() == trainer.datamodule.state_dict()


def test_flat_checkpoint_resumes_exactly(tmp_path: Path) -> None:
    """A run resumed from a checkpoint with the old flat data settings trains on the batches of one never stopped."""
    _, uninterrupted = fit(PromptDataModule(**GROUPED), 5, tmp_path)
    path, _ = flat_checkpoint(tmp_path, 2)
    _, first = fit(PromptDataModule(**GROUPED), 2, tmp_path)
    _, resumed = fit(PromptDataModule(**GROUPED), 5, tmp_path, ckpt_path=str(path))
    assert len(uninterrupted.seen) == 5 and first.seen + resumed.seen == uninterrupted.seen


def test_resume_compares_flat_data_settings_per_group(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, _ = flat_checkpoint(tmp_path, 1)
    config = {name: dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
              for name, value in GROUPED.items()}  # fmt: skip
    config["splits"] = config["splits"] | {"num_train": 8}
    with caplog.at_level("WARNING"):
        assert resolve_resume(str(path), object(), None, config) == str(path)
    [line] = [r.getMessage() for r in caplog.records if "config's value wins" in r.getMessage()]
    assert line.endswith("the config's value wins for --data.splits.num_train (checkpoint 7, config 8)"), line
