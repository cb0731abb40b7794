"""``PromptDataModule``: prompts for RL rollouts from files, ``datasets`` folders, the maze task or reasoning-gym."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Literal, get_args

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_fgrpo.data.records import NonStringAnswers, PromptRecord, SourceExample, TooLongPolicy, render_records
from lit_fgrpo.data.sources import (
    read_arithmetic_splits,
    read_disk_dataset,
    read_jsonl,
    read_maze_splits,
    read_parquet,
    read_reasoning_gym,
)
from lit_fgrpo.data.streaming import PromptStream
from lit_fgrpo.distributed.rank_layout import per_rank_share
from lit_fgrpo.errors import DataError
from lit_fgrpo.models.policy import BUILTIN_MAZE_TOKENIZER, load_tokenizer
from lit_fgrpo.tasks.arithmetic import ArithmeticSettings
from lit_fgrpo.tasks.maze import MazeConfig
from lit_fgrpo.training.settings_mapping import settings_from

log = logging.getLogger(__name__)

Source = Literal["jsonl", "parquet", "disk", "maze", "reasoning_gym", "arithmetic"]


def keep_batch(batch: list[PromptRecord]) -> list[PromptRecord]:
    """Collate function: a batch is the list of records, unchanged."""
    return batch


class PromptDataModule(L.LightningDataModule):
    """Streams training prompts (``list[PromptRecord]`` batches) and serves fixed eval sets.

    Batch sizes are global, as TRL, verl and the paper report them: ``prompts_per_step`` prompts per optimisation
    step over all ranks, each rank taking ``prompts_per_step / world_size`` of them (refused when it does not
    divide), so the same config trains on the same prompts on 1 rank or 16.

    Training is an endless :class:`~lit_fgrpo.data.streaming.PromptStream`, reshuffled every epoch and sharded by
    rank and dataloader worker; bound the run with ``max_steps``. Its position is saved in Lightning checkpoints
    through :meth:`state_dict` and counts only batches that reached the training step (counted in
    ``on_before_batch_transfer``, after Lightning's one-batch prefetch), so a resumed run continues with exactly
    the batch that would have come next, for any ``num_workers``. The LightningModule should therefore not
    override ``on_before_batch_transfer`` or ``transfer_batch_to_device`` (Lightning would use these).

    Prompts longer than ``max_prompt_length`` follow ``too_long``: skipped by default, with a warning that gives
    the count.

    Args:
        source: Where prompts come from: ``jsonl`` / ``parquet`` files, ``disk`` (a ``datasets`` folder from
            ``save_to_disk``), ``maze`` (generated mazes), ``reasoning_gym`` (a dataset by name) or ``arithmetic``
            (generated sums for a small instruct model, :mod:`lit_fgrpo.tasks.arithmetic`).
        train_path: Training file or folder (jsonl, parquet, disk).
        val_path: Validation file or folder; if unset, ``val_size`` training rows are held out instead.
        test_path: Optional test file or folder (jsonl, parquet, disk); the maze source has its own test split.
        prompt_field: Field holding the prompt: a string, or a list of chat messages.
        answer_field: Required answer field (checked in every row), passed to rewards as the ``answer`` column.
        system_prompt: Optional system message, e.g. "Please reason step by step, and put your final answer
            within \\boxed{}."
        reasoning_gym_name: reasoning-gym dataset name, e.g. ``countdown`` (source ``reasoning_gym``).
        dataset_size: Training entries to generate (source ``reasoning_gym``).
        maze_rows: Maze cell rows.
        maze_cols: Maze cell columns.
        maze_newline_tokens: End every maze prompt row with a ``NEWLINE`` token.
        maze_border_walls: Write the outer wall border in maze prompts.
        arithmetic: The ``arithmetic`` source's questions: operand range, operators, terms, instruction.
        num_train: Training mazes or arithmetic questions.
        num_val: Validation mazes or arithmetic questions.
        num_test: Test mazes or arithmetic questions.
        prompts_per_step: Prompts per training step over all ranks (global P); each rank takes P / world_size,
            which must be a whole number.
        val_batch_size: Prompts per validation/test batch over all ranks (each rank takes the rounded-up share);
            defaults to ``prompts_per_step``.
        max_prompt_length: Longest prompt in tokens.
        too_long: Longer prompts: ``skip`` (counted, warned), ``truncate_left`` (keep the last tokens, counted,
            warned) or ``error``.
        seed: Seed for shuffling, held-out validation rows, mazes and reasoning-gym generation.
        num_workers: Dataloader worker processes (0 loads in the main process; the resume point is exact either way).
        val_size: Held-out validation rows when ``val_path`` is unset, or reasoning-gym validation entries (0 = none).
        tokenizer_path: Tokenizer to load with ``AutoTokenizer``; else use ``set_tokenizer`` (the maze source falls
            back to the maze word tokenizer).
        non_string_answers: An answer that is a number or a list: ``error`` (file and row named) or ``str``
            (converted with ``str()``, counted and logged) (jsonl, parquet, disk).
    """

    def __init__(
        self,
        source: Source = "maze",
        train_path: str | None = None,
        val_path: str | None = None,
        test_path: str | None = None,
        prompt_field: str = "prompt",
        answer_field: str = "answer",
        system_prompt: str | None = None,
        reasoning_gym_name: str | None = None,
        dataset_size: int = 1000,
        maze_rows: int = 4,
        maze_cols: int = 4,
        maze_newline_tokens: bool = True,
        maze_border_walls: bool = True,
        arithmetic: ArithmeticSettings | dict[str, Any] = ArithmeticSettings(),
        num_train: int = 1000,
        num_val: int = 100,
        num_test: int = 100,
        prompts_per_step: int = 8,
        val_batch_size: int | None = None,
        max_prompt_length: int = 512,
        too_long: TooLongPolicy = "skip",
        seed: int = 0,
        num_workers: int = 0,
        val_size: int = 64,
        tokenizer_path: str | None = None,
        non_string_answers: NonStringAnswers = "error",
    ) -> None:
        super().__init__()
        self.arithmetic = settings_from(ArithmeticSettings, arithmetic, "--data.arithmetic")
        # Plain dicts in the hyperparameters: checkpoints load with weights_only=True, and loggers cannot log a
        # frozen dataclass (as FGRPOModule's groups).
        self.save_hyperparameters(ignore=["arithmetic"])
        self.save_hyperparameters(dict(self.hparams) | {"arithmetic": dataclasses.asdict(self.arithmetic)})
        self.source = source
        self.train_path, self.val_path, self.test_path = train_path, val_path, test_path
        self.prompt_field, self.answer_field, self.system_prompt = prompt_field, answer_field, system_prompt
        self.reasoning_gym_name, self.dataset_size = reasoning_gym_name, dataset_size
        self.maze_options = (maze_rows, maze_cols, maze_newline_tokens, maze_border_walls)
        self.num_train, self.num_val, self.num_test = num_train, num_val, num_test
        self.prompts_per_step = prompts_per_step
        self.val_batch_size = val_batch_size or prompts_per_step
        self.max_prompt_length, self.too_long = max_prompt_length, too_long
        self.seed, self.num_workers, self.val_size = seed, num_workers, val_size
        self.tokenizer_path = tokenizer_path
        self.non_string_answers: NonStringAnswers = non_string_answers
        self._validate_args()
        self.tokenizer: Any = None
        self.splits: dict[str, list[PromptRecord]] = {}
        """Rendered records per split (``train``, ``val``, ``test``), filled by :meth:`setup`."""
        self._train_stream: PromptStream | None = None
        self._pending_state: dict[str, Any] | None = None
        self._drawn_prompts = 0  # this rank's cursor of draw_prompts (dynamic sampling), in records

    def _validate_args(self) -> None:
        def fail(flag: str, problem: str) -> DataError:
            return DataError(f"PromptDataModule.{flag} {problem}")

        if self.source not in get_args(Source):
            raise fail("source", f"must be one of {get_args(Source)}, got {self.source!r}")
        if self.non_string_answers not in get_args(NonStringAnswers):
            raise fail(
                "non_string_answers", f"must be one of {get_args(NonStringAnswers)}, got {self.non_string_answers!r}"
            )
        if self.too_long not in get_args(TooLongPolicy):
            raise fail("too_long", f"must be one of {get_args(TooLongPolicy)}, got {self.too_long!r}")
        for flag in ("prompts_per_step", "val_batch_size", "max_prompt_length", "dataset_size", "num_train"):
            if getattr(self, flag) < 1:
                raise fail(flag, f"must be >= 1, got {getattr(self, flag)}")
        for flag in ("num_workers", "val_size", "num_val", "num_test"):
            if getattr(self, flag) < 0:
                raise fail(flag, f"must be >= 0, got {getattr(self, flag)}")
        if self.source in ("jsonl", "parquet", "disk"):
            if self.train_path is None:
                raise fail("train_path", f"is required with source={self.source!r}")
            for flag in ("train_path", "val_path", "test_path"):
                path = getattr(self, flag)
                if path is not None and not Path(path).exists():
                    raise fail(flag, f"does not exist: {path}")
        if self.source == "reasoning_gym" and not self.reasoning_gym_name:
            raise fail("reasoning_gym_name", "is required with source='reasoning_gym'")
        if self.source == "maze":
            try:
                self._maze_config()
            except ValueError as err:
                raise fail("maze_rows/maze_cols", str(err)) from None
        if (
            self.tokenizer_path is not None
            and self.tokenizer_path != BUILTIN_MAZE_TOKENIZER
            and not Path(self.tokenizer_path).exists()
        ):
            raise fail("tokenizer_path", f"does not exist: {self.tokenizer_path}")

    def _maze_config(self) -> MazeConfig:
        rows, cols, newline_tokens, border_walls = self.maze_options
        return MazeConfig(rows=rows, cols=cols, newline_tokens=newline_tokens, border_walls=border_walls)

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Use this tokenizer (normally the policy's) to render and tokenize prompts; re-renders on a change."""
        if tokenizer is not self.tokenizer:
            self.splits = {}
        self.tokenizer = tokenizer

    def _resolve_tokenizer(self) -> Any:
        if self.tokenizer is None and self.tokenizer_path is not None:
            self.tokenizer = load_tokenizer(self.tokenizer_path)
        if self.tokenizer is None and self.source == "maze":
            from lit_fgrpo.tasks.maze import MAZE_VOCAB
            from lit_fgrpo.tasks.word_tokenizer import build_word_tokenizer

            self.tokenizer = build_word_tokenizer(MAZE_VOCAB)
        if self.tokenizer is None:
            raise DataError(
                "PromptDataModule needs a tokenizer: on the command line it is the policy's "
                "(--model.policy.model or --model.policy.tokenizer); in Python pass tokenizer_path or call set_tokenizer()"
            )
        return self.tokenizer

    def _read(self, path: str) -> list[SourceExample]:
        required = (self.answer_field,)
        rule = self.non_string_answers
        if self.source == "jsonl":
            examples = read_jsonl(path, self.prompt_field, required, non_string_answers=rule)
        elif self.source == "parquet":
            examples = read_parquet(path, self.prompt_field, required, non_string_answers=rule)
        else:
            examples = read_disk_dataset(path, "train", self.prompt_field, required, non_string_answers=rule)
        if self.answer_field != "answer":
            for example in examples:
                example.columns["answer"] = example.columns[self.answer_field]
        return examples

    def _read_splits(self) -> dict[str, list[SourceExample]]:
        if self.source == "maze":
            return read_maze_splits(self._maze_config(), self.num_train, self.num_val, self.num_test, self.seed)
        if self.source == "arithmetic":
            return read_arithmetic_splits(self.arithmetic, self.num_train, self.num_val, self.num_test, self.seed)
        if self.source == "reasoning_gym":
            assert self.reasoning_gym_name is not None
            examples = read_reasoning_gym(self.reasoning_gym_name, self.seed, self.dataset_size + self.val_size)
            return {"train": examples[: self.dataset_size], "val": examples[self.dataset_size :]}
        assert self.train_path is not None
        splits = {"train": self._read(self.train_path)}
        if self.val_path is not None:
            splits["val"] = self._read(self.val_path)
        elif self.val_size:
            if self.val_size >= len(splits["train"]):
                raise DataError(
                    f"PromptDataModule.val_size={self.val_size} leaves no training rows of {len(splits['train'])}"
                )
            held_out = set(torch.randperm(len(splits["train"]), generator=torch.Generator().manual_seed(self.seed))
                           [: self.val_size].tolist())  # fmt: skip
            splits["val"] = [ex for ex in splits["train"] if ex.index in held_out]
            splits["train"] = [ex for ex in splits["train"] if ex.index not in held_out]
        if self.test_path is not None:
            splits["test"] = self._read(self.test_path)
        return splits

    def setup(self, stage: str | None = None) -> None:
        """Read, render and tokenize every split (once; later calls reuse them)."""
        if self.trainer is not None:  # refuse a global batch that does not divide before reading any data
            per_rank_share(self.prompts_per_step, self.trainer.world_size, "--data.prompts_per_step")
        if self.splits:
            return
        tokenizer = self._resolve_tokenizer()
        origin = {"reasoning_gym": self.reasoning_gym_name, "arithmetic": "generated"}.get(self.source, self.train_path)
        for name, examples in self._read_splits().items():
            if examples:
                self.splits[name] = render_records(
                    examples,
                    tokenizer,
                    self.max_prompt_length,
                    self.too_long,
                    self.system_prompt,
                    source=f"{self.source}:{origin or name} ({name} split)",
                )

    def _rank_and_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _loader(self, stream: PromptStream) -> DataLoader:
        return DataLoader(stream, batch_size=None, collate_fn=keep_batch, num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        """Endless stream of ``list[PromptRecord]`` batches: this rank's ``prompts_per_step / world_size`` prompts."""
        self.setup("fit")
        rank, world_size = self._rank_and_world()
        per_rank = per_rank_share(self.prompts_per_step, world_size, "--data.prompts_per_step")
        stream = PromptStream(self.splits["train"], per_rank, seed=self.seed, rank=rank, world_size=world_size)
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
        per_rank = -(-self.val_batch_size // world_size)  # evaluation batches may be short: no need to divide
        stream = PromptStream(self.splits[split], per_rank, infinite=False, rank=rank, world_size=world_size)
        return self._loader(stream)

    def val_dataloader(self) -> DataLoader | list:
        """The fixed validation set, one pass in order (an empty list when there is none)."""
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader | list:
        """The test split (maze, or ``test_path``), one pass in order (an empty list when there is none)."""
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
