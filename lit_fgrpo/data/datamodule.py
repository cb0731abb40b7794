"""``PromptDataModule``: prompts for RL rollouts from files, ``datasets`` folders, reasoning-gym, a registered task, or
none (the environment's ``reset()`` gives them)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import IO, Any

import lightning as L
import torch
from torch.utils.data import DataLoader
from typing_extensions import Self

from lit_fgrpo.data.data_settings import (
    ENVIRONMENT_SOURCE,
    FILE_SOURCES,
    FLAG,
    GYM_SOURCE,
    EnvironmentRowSettings,
    FileSettings,
    LoaderSettings,
    PromptSettings,
    ReasoningGymSettings,
    SplitSettings,
    grouped_data_settings,
    source_names,
    tasks_settings,
)
from lit_fgrpo.data.environment_rows import check_bounded_fit, environment_splits
from lit_fgrpo.data.file_splits import check_file_paths, read_file_splits
from lit_fgrpo.data.generated_sources import read_reasoning_gym, read_task_splits
from lit_fgrpo.data.records import PromptRecord, SourceExample, render_records
from lit_fgrpo.data.streaming import PromptStream
from lit_fgrpo.distributed.rank_layout import per_rank_share
from lit_fgrpo.errors import ConfigError, DataError
from lit_fgrpo.settings_mapping import read_checkpoint, settings_from
from lit_fgrpo.tasks.registry import default_task, find_task, is_builtin_tokenizer, load_tokenizer

log = logging.getLogger(__name__)

PROMPTS_PER_STEP = f"{FLAG}.loader.prompts_per_step"
"""The global batch's flag, named when it does not divide by the world size."""


def keep_batch(batch: list[PromptRecord]) -> list[PromptRecord]:
    """Collate function: a batch is the list of records, unchanged."""
    return batch


class PromptDataModule(L.LightningDataModule):
    """Streams training prompts (``list[PromptRecord]`` batches) and serves fixed eval sets.

    Batch sizes are global, as TRL, verl and the paper report them: ``loader.prompts_per_step`` prompts per
    optimisation step over all ranks, each rank taking ``prompts_per_step / world_size`` of them (refused when it does
    not divide), so the same config trains on the same prompts on 1 rank or 16.

    Training is an endless :class:`~lit_fgrpo.data.streaming.PromptStream`, reshuffled every epoch and sharded by
    rank and dataloader worker; bound the run with ``max_steps``. Its position is saved in Lightning checkpoints
    through :meth:`state_dict` and counts only batches that reached the training step (counted in
    ``on_before_batch_transfer``, after Lightning's one-batch prefetch), so a resumed run continues with exactly
    the batch that would have come next, for any ``num_workers``. The LightningModule should therefore not
    override ``on_before_batch_transfer`` or ``transfer_batch_to_device`` (Lightning would use these).

    Prompts longer than ``prompts.max_length`` follow ``prompts.too_long``: skipped by default, with a warning that
    gives the count.

    With source ``environment`` the environment owns the data (TRL's ``environment_factory`` without a dataset): its
    rows hold no question (``prompt=""``, ``prompt_ids=[]``, ``messages=[]``; ``reset()`` gives the first user
    message), training never runs out of them and a fit needs ``--trainer.max_steps``
    (:mod:`lit_fgrpo.data.environment_rows`).

    Args:
        source: Where prompts come from: ``jsonl`` / ``parquet`` files, ``disk`` (a ``datasets`` folder from
            ``save_to_disk``), ``reasoning_gym`` (a dataset by name), or a registered task by its name (``maze``,
            ``arithmetic``: :mod:`lit_fgrpo.tasks.registry`), or ``environment`` (the environment's ``reset()`` gives
            each prompt); by default the default task (the maze).
        files: The file sources' paths and fields (``--data.files.*``; :class:`~lit_fgrpo.data.data_settings.FileSettings`).
        reasoning_gym: The reasoning-gym dataset name and size (``--data.reasoning_gym.*``;
            :class:`~lit_fgrpo.data.data_settings.ReasoningGymSettings`).
        environment_rows: The ``environment`` source's validation and test rows (``--data.environment_rows.*``;
            :class:`~lit_fgrpo.data.data_settings.EnvironmentRowSettings`).
        splits: Prompts per split: a task's training, validation and test prompts, held-out validation rows
            (``--data.splits.*``; :class:`~lit_fgrpo.data.data_settings.SplitSettings`).
        prompts: System message, length limit and what to do with longer prompts (``--data.prompts.*``;
            :class:`~lit_fgrpo.data.data_settings.PromptSettings`).
        loader: Global prompts per training step and per evaluation batch, dataloader workers
            (``--data.loader.*``; :class:`~lit_fgrpo.data.data_settings.LoaderSettings`).
        seed: Seed for shuffling, held-out validation rows, the task's prompts and reasoning-gym generation.
        tokenizer_path: Tokenizer to load: a folder, or a task's own (``builtin:maze``); else use ``set_tokenizer``
            (a task with a tokenizer of its own falls back to it). On the command line it is the policy's
            (``--model.policy.tokenizer``, else ``--model.policy.model``).
        **task_settings: Each registered task's settings under its name (``maze=MazeConfig(rows=5)``); a task not
            given keeps its defaults. The CLI adds one group per registered task (``--data.maze.rows 5``).

    Each group may also be given as a mapping of its fields (as checkpoints store them).
    """

    def __init__(
        self,
        source: str | None = None,
        files: FileSettings = FileSettings(),
        reasoning_gym: ReasoningGymSettings = ReasoningGymSettings(),
        environment_rows: EnvironmentRowSettings = EnvironmentRowSettings(),
        splits: SplitSettings = SplitSettings(),
        prompts: PromptSettings = PromptSettings(),
        loader: LoaderSettings = LoaderSettings(),
        seed: int = 0,
        tokenizer_path: str | None = None,
        **task_settings: Any,
    ) -> None:
        super().__init__()
        self.source: str = default_task().name if source is None else source
        self.files = settings_from(FileSettings, files, f"{FLAG}.files")
        """The file sources' paths and fields (``--data.files.*``)."""
        self.task_settings: dict[str, Any] = tasks_settings(task_settings)
        """Every registered task's settings by task name (``--data.<task>.*``)."""
        self.reasoning_gym = settings_from(ReasoningGymSettings, reasoning_gym, f"{FLAG}.reasoning_gym")
        """The reasoning-gym dataset (``--data.reasoning_gym.*``)."""
        self.environment_rows = settings_from(EnvironmentRowSettings, environment_rows, f"{FLAG}.environment_rows")
        """The ``environment`` source's evaluation rows (``--data.environment_rows.*``)."""
        self.split_settings = settings_from(SplitSettings, splits, f"{FLAG}.splits")
        """Prompts per split (``--data.splits.*``); :attr:`splits` holds the rendered records."""
        self.prompts = settings_from(PromptSettings, prompts, f"{FLAG}.prompts")
        """Rendering: system message, length limit (``--data.prompts.*``)."""
        self.loader = settings_from(LoaderSettings, loader, f"{FLAG}.loader")
        """Global batch sizes and dataloader workers (``--data.loader.*``)."""
        self.seed, self.tokenizer_path = seed, tokenizer_path
        self._validate_args()
        self.save_hyperparameters()
        # Plain dicts in the hyperparameters: checkpoints load with weights_only=True, and loggers cannot log a frozen
        # dataclass (as FGRPOModule's groups). Saved again so that hparams_initial holds the dicts too; what else the
        # first save holds (LightningCLI's _instantiator) is kept.
        groups = {"files": self.files, **self.task_settings, "reasoning_gym": self.reasoning_gym,
                  "environment_rows": self.environment_rows, "splits": self.split_settings, "prompts": self.prompts,
                  "loader": self.loader}  # fmt: skip
        settings = (
            {"source": self.source}
            | {name: dataclasses.asdict(group) for name, group in groups.items()}
            | {"seed": seed, "tokenizer_path": tokenizer_path}
        )
        self.save_hyperparameters(settings | {k: v for k, v in self.hparams.items() if k not in settings})
        self.tokenizer: Any = None
        self.splits: dict[str, list[PromptRecord]] = {}
        """Rendered records per split (``train``, ``val``, ``test``), filled by :meth:`setup`."""
        self._train_stream: PromptStream | None = None
        self._pending_state: dict[str, Any] | None = None
        self._drawn_prompts = 0  # this rank's cursor of draw_prompts (dynamic sampling), in records

    @classmethod
    def load_from_checkpoint(  # type: ignore[override]
        cls, checkpoint_path: str | Path | IO[bytes], **kwargs: Any
    ) -> Self:
        """The data module a checkpoint was saved with, at its resume point; ``kwargs`` replace its settings.

        Lightning's own loader hands every saved setting to ``__init__`` (which takes the tasks' groups by name, so it
        would not filter them) or to LightningCLI's instantiator (which does not know the tasks' groups); here the
        saved settings are grouped first (:func:`~lit_fgrpo.data.data_settings.grouped_data_settings`: the flat ones
        of a checkpoint from before the groups too; Lightning's ``_instantiator`` and ``_class_path`` dropped).
        """
        checkpoint = read_checkpoint(checkpoint_path)
        settings = grouped_data_settings(checkpoint.get(cls.CHECKPOINT_HYPER_PARAMS_KEY, {}))
        datamodule = cls(**(settings | kwargs))
        if cls.__qualname__ in checkpoint:  # the stream's position, as Lightning's loader restores it
            datamodule.load_state_dict(checkpoint[cls.__qualname__])
        return datamodule

    def _validate_args(self) -> None:
        """The checks across groups (each group checked its own values); one line naming the full flag."""
        source = self.source
        if source not in source_names():
            raise ConfigError(f"{FLAG}.source must be one of {source_names()}, got {source!r}")
        if source in FILE_SOURCES:
            check_file_paths(source, self.files)
        if source == GYM_SOURCE and not self.reasoning_gym.name:
            raise ConfigError(f"{FLAG}.reasoning_gym.name is required with {FLAG}.source {GYM_SOURCE}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"{FLAG}.seed: expected an int, got {self.seed!r}")
        path = self.tokenizer_path
        if path is not None and not is_builtin_tokenizer(path) and not Path(path).exists():
            raise DataError(f"{FLAG}.tokenizer_path does not exist: {path}")

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Use this tokenizer (normally the policy's) to render and tokenize prompts; re-renders on a change."""
        if tokenizer is not self.tokenizer:
            self.splits = {}
        self.tokenizer = tokenizer

    def _resolve_tokenizer(self) -> Any:
        if self.tokenizer is None and self.tokenizer_path is not None:
            self.tokenizer = load_tokenizer(self.tokenizer_path)
        task = find_task(self.source)
        if self.tokenizer is None and task is not None and task.tokenizer is not None:
            self.tokenizer = task.tokenizer()  # a task with a vocabulary of its own (the maze's words)
        if self.tokenizer is None:
            raise DataError(
                "PromptDataModule needs a tokenizer: on the command line it is the policy's "
                "(--model.policy.model or --model.policy.tokenizer); in Python pass tokenizer_path or call set_tokenizer()"
            )
        return self.tokenizer

    def _read_splits(self) -> dict[str, list[SourceExample]]:
        sizes = self.split_settings
        if self.source in self.task_settings:
            settings = self.task_settings[self.source]
            return read_task_splits(self.source, settings, sizes.num_train, sizes.num_val, sizes.num_test, self.seed)
        if self.source == GYM_SOURCE:
            gym = self.reasoning_gym
            assert gym.name is not None
            examples = read_reasoning_gym(gym.name, self.seed, gym.dataset_size + sizes.val_size)
            return {"train": examples[: gym.dataset_size], "val": examples[gym.dataset_size :]}
        return read_file_splits(self.source, self.files, sizes.val_size, self.seed)

    def setup(self, stage: str | None = None) -> None:
        """Read, render and tokenize every split (once; later calls reuse them); the ``environment`` source's rows
        need no tokenizer."""
        if self.trainer is not None:  # refuse a global batch that does not divide before reading any data
            per_rank_share(self.loader.prompts_per_step, self.trainer.world_size, PROMPTS_PER_STEP)
            if stage == "fit" and self.source == ENVIRONMENT_SOURCE:
                check_bounded_fit(self.trainer)
        if self.splits:
            return
        if self.source == ENVIRONMENT_SOURCE:
            self.splits = environment_splits(self.environment_rows)
            return
        tokenizer = self._resolve_tokenizer()
        if self.source in self.task_settings:
            origin: str | None = "generated"
        else:
            origin = self.reasoning_gym.name if self.source == GYM_SOURCE else self.files.train_path
        for name, examples in self._read_splits().items():
            if examples:
                self.splits[name] = render_records(
                    examples,
                    tokenizer,
                    self.prompts.max_length,
                    self.prompts.too_long,
                    self.prompts.system_prompt,
                    source=f"{self.source}:{origin or name} ({name} split)",
                )

    def _rank_and_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _loader(self, stream: PromptStream) -> DataLoader:
        return DataLoader(stream, batch_size=None, collate_fn=keep_batch, num_workers=self.loader.num_workers)

    def train_dataloader(self) -> DataLoader:
        """Endless stream of ``list[PromptRecord]`` batches: this rank's ``prompts_per_step / world_size`` prompts
        (``--data.loader.prompts_per_step``)."""
        self.setup("fit")
        rank, world_size = self._rank_and_world()
        per_rank = per_rank_share(self.loader.prompts_per_step, world_size, PROMPTS_PER_STEP)
        shuffle = self.source != ENVIRONMENT_SOURCE  # one row: nothing to shuffle
        stream = PromptStream(
            self.splits["train"], per_rank, shuffle=shuffle, seed=self.seed, rank=rank, world_size=world_size
        )
        stream.count_yielded = False  # counted in on_before_batch_transfer, after Lightning's prefetch
        if self._pending_state is not None:
            stream.load_state_dict(self._pending_state)
            self._pending_state = None
        elif self._train_stream is not None:
            stream.next_batch = self._train_stream.next_batch
        self._train_stream = stream
        return self._loader(stream)

    # ---- random access to the training stream (asynchronous rollouts, issue 11) ----
    def train_batch(self, index: int) -> list[PromptRecord]:
        """This rank's training batch number ``index`` of the stream (what the loader yields as its ``index``-th).

        Used by asynchronous rollouts to sample batches ahead of the loader; call it after ``train_dataloader``.
        """
        if self._train_stream is None:
            raise RuntimeError("PromptDataModule.train_batch needs the training stream: call train_dataloader() first")
        return self._train_stream.batch(index)

    @property
    def train_position(self) -> int:
        """Training batches handed to the training step so far on this rank (the stream's resume point)."""
        return 0 if self._train_stream is None else self._train_stream.next_batch

    # ---- end of the asynchronous-rollout accessors ----

    def _eval_loader(self, split: str) -> DataLoader | list:
        self.setup(split)
        if split not in self.splits:
            return []
        rank, world_size = self._rank_and_world()
        per_rank = -(-self.loader.eval_batch_size // world_size)  # evaluation batches may be short: no need to divide
        stream = PromptStream(self.splits[split], per_rank, infinite=False, rank=rank, world_size=world_size)
        return self._loader(stream)

    def val_dataloader(self) -> DataLoader | list:
        """The fixed validation set, one pass in order (an empty list when there is none)."""
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader | list:
        """The test split (generated sources, or ``files.test_path``), one pass in order (an empty list when there is none)."""
        return self._eval_loader("test")

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Count a training batch as consumed when it is handed to the training step."""
        trainer = self.trainer
        if trainer is not None and trainer.training and self._train_stream is not None:
            self._train_stream.next_batch += 1
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Records hold no tensors: the batch stays as it is."""
        return batch

    def draw_prompts(self, count: int) -> list[PromptRecord]:
        """The next ``count`` training prompts of this rank, for dynamic sampling; they are consumed.

        A cursor of its own walks this rank's share of the training sequence (the same reshuffled epochs as the
        batches) and advances by every prompt drawn, kept or discarded; it is saved in :meth:`state_dict`, so a
        resumed run draws the next undrawn prompt. With dynamic sampling the records of the loader's batches are
        not trained on (the batches only pace the steps): every trained prompt comes from here.
        """
        if count < 0:
            raise ValueError(f"PromptDataModule.draw_prompts: count must be >= 0, got {count}")
        if self._train_stream is None:
            self.train_dataloader()
        assert self._train_stream is not None
        records = self._train_stream.records_at(self._drawn_prompts, count)
        self._drawn_prompts += count
        return records

    @property
    def drawn_prompts(self) -> int:
        """Prompts this rank has taken through :meth:`draw_prompts` (the dynamic-sampling data position)."""
        return self._drawn_prompts

    def state_dict(self) -> dict[str, Any]:
        """The training stream's resume point (epoch, position, next batch) and the draw cursor."""
        state: dict[str, Any] = {"drawn_prompts": self._drawn_prompts} if self._drawn_prompts else {}
        if self._train_stream is not None:
            return state | {"train_stream": self._train_stream.state_dict()}
        return state | ({"train_stream": self._pending_state} if self._pending_state is not None else {})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the training stream (and the draw cursor) where the checkpoint left it."""
        self._drawn_prompts = int(state_dict.get("drawn_prompts", 0))
        self._pending_state = state_dict.get("train_stream")
        if self._pending_state is not None and self._train_stream is not None:
            self._train_stream.load_state_dict(self._pending_state)
            self._pending_state = None
