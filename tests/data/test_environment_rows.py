"""The ``environment`` source (issue 47): rows without a question for an environment whose ``reset()`` gives the
prompt, endless and sharded for training, a fixed count for validation, and a fit bounded by ``max_steps``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch

from lit_fgrpo.data import ENVIRONMENT_SOURCE, PromptDataModule, PromptRecord
from lit_fgrpo.data.environment_rows import endless_fit
from lit_fgrpo.errors import ConfigError


def environment_data(**settings: Any) -> PromptDataModule:
    return PromptDataModule(source=ENVIRONMENT_SOURCE, **({"loader": {"prompts_per_step": 4}} | settings))


def as_rank(module: PromptDataModule, rank: int, world_size: int) -> PromptDataModule:
    """The data module as Lightning's trainer on rank ``rank`` of ``world_size`` would see it."""
    module.trainer = SimpleNamespace(  # type: ignore[assignment]
        global_rank=rank, world_size=world_size, max_steps=10, max_epochs=None, limit_train_batches=1.0, callbacks=[]
    )
    return module


def is_empty_row(record: PromptRecord) -> bool:
    return (record.prompt, record.prompt_ids, record.messages, record.columns) == ("", [], [], {})


# ------------------------------------------------------------------------------------------------------- the rows


def test_rows_hold_no_question_and_need_no_tokenizer() -> None:
    module = environment_data(environment_rows={"val_size": 3})
    module.setup("fit")  # no tokenizer: nothing to render
    assert sorted(module.splits) == ["train", "val"]
    assert all(is_empty_row(record) for split in module.splits.values() for record in split)
    assert [record.index for record in module.splits["val"]] == [0, 1, 2]
    assert module.test_dataloader() == []  # test_size 0: no test split


def test_training_is_endless_with_a_position_per_row() -> None:
    loader = environment_data().train_dataloader()
    batches = [batch for batch, _ in zip(loader, range(50))]
    assert [[record.position for record in batch] for batch in batches[:2]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [record.position for batch in batches for record in batch] == list(range(200))
    assert all(is_empty_row(record) for batch in batches for record in batch)


def test_two_ranks_share_the_positions_as_any_stream_does() -> None:
    ranks = [as_rank(environment_data(), rank, 2) for rank in range(2)]
    seen = [[[r.position for r in batch] for batch, _ in zip(m.train_dataloader(), range(3))] for m in ranks]
    assert seen[0] == [[0, 2], [4, 6], [8, 10]] and seen[1] == [[1, 3], [5, 7], [9, 11]]
    validation = [environment_data(environment_rows={"val_size": 5}) for _ in range(2)]
    held_out = [
        [r.position for b in as_rank(m, rank, 2).val_dataloader() for r in b] for rank, m in enumerate(validation)
    ]
    assert held_out == [[0, 2, 4], [1, 3]]


def test_dataloader_workers_and_dynamic_sampling_draws() -> None:
    module = environment_data(loader={"prompts_per_step": 3, "num_workers": 2})
    batches = [batch for batch, _ in zip(module.train_dataloader(), range(4))]
    assert [r.position for batch in batches for r in batch] == list(range(12))
    assert [r.position for r in module.draw_prompts(5)] == [0, 1, 2, 3, 4]
    assert [r.position for r in module.draw_prompts(2)] == [5, 6]


def test_the_longest_prompt_of_every_split_is_zero_tokens() -> None:
    """The rollout's ``check_prompt_room`` reads each split's longest prompt; an empty one leaves all the room."""
    from lit_fgrpo.rollout.rollout_settings import RolloutSettings

    module = environment_data(environment_rows={"val_size": 2, "test_size": 1})
    module.setup("fit")
    longest = {split: max(len(r.prompt_ids) for r in records) for split, records in module.splits.items() if records}
    assert longest == {"train": 0, "val": 0, "test": 0}
    RolloutSettings(engine="vllm", engine_kwargs={"max_model_len": 8}).check_prompt_room(longest)


def test_settings_round_trip_through_the_hyperparameters() -> None:
    module = environment_data(environment_rows={"val_size": 2})
    assert module.hparams["environment_rows"] == {"val_size": 2, "test_size": 0}
    assert PromptDataModule(**module.hparams).environment_rows == module.environment_rows


# ------------------------------------------------------------------------------------------ a fit bounded by max_steps


class PositionModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list[int | None]] = []

    def training_step(self, batch: list[PromptRecord], batch_idx: int) -> torch.Tensor:
        self.seen.append([record.position for record in batch])
        return (self.weight**2).sum() + 1.0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(module: PromptDataModule, tmp_path: Path, ckpt_path: str | None = None, **trainer: Any) -> L.Trainer:
    lightning = L.Trainer(
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, default_root_dir=tmp_path, accelerator="cpu", devices=1, **trainer,
    )  # fmt: skip
    lightning.fit(PositionModule(), datamodule=module, ckpt_path=ckpt_path)
    return lightning


def test_a_fit_resumes_at_the_next_position(tmp_path: Path) -> None:
    whole = fit(environment_data(), tmp_path, max_steps=4).lightning_module
    first = fit(environment_data(), tmp_path, max_steps=2)
    first.save_checkpoint(tmp_path / "mid.ckpt")
    resumed = fit(environment_data(), tmp_path, str(tmp_path / "mid.ckpt"), max_steps=4).lightning_module
    assert whole.seen == first.lightning_module.seen + resumed.seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11],
                                                                         [12, 13, 14, 15]]  # fmt: skip


def test_a_fit_without_max_steps_is_refused_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--trainer.max_steps is required with --data.source environment: ") as e:
        fit(environment_data(), tmp_path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("max_steps", "max_epochs", "limit_train_batches", "timed", "endless"),
    [
        (-1, None, 1.0, False, True),  # Lightning's defaults: the endless stream never ends an epoch
        (-1, -1, 1.0, False, True),
        (-1, 3, 1.0, False, True),  # epochs of an endless stream never end
        (-1, -1, 5, False, True),  # short epochs, but no end to them
        (5, None, 1.0, False, False),
        (0, None, 1.0, False, False),
        (-1, None, 1.0, True, False),  # --trainer.max_time
        (-1, None, 5, False, False),  # Lightning's 1000 epochs of 5 batches
        (-1, 2, 5, False, False),
        (-1, 2, True, False, True),  # a bool is no batch count
    ],
)
def test_endless_fit(
    max_steps: int, max_epochs: int | None, limit_train_batches: Any, timed: bool, endless: bool
) -> None:
    assert endless_fit(max_steps, max_epochs, limit_train_batches, timed) is endless
