"""Prompt sources, rendering, bad input, the sharded resumable stream and the data module."""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from pathlib import Path

import lightning as L
import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from tokenizers.processors import TemplateProcessing
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerFast

from lit_fgrpo.data import (
    FileSettings,
    LoaderSettings,
    PromptDataModule,
    PromptRecord,
    PromptSettings,
    PromptStream,
    ReasoningGymSettings,
    SourceExample,
    SplitSettings,
    read_disk_dataset,
    read_jsonl,
    read_parquet,
    render_records,
)
from lit_fgrpo.data.datamodule import keep_batch

WORDS = ["<unk>", "<s>", "</s>", "what", "is", "one", "plus", "two", "three", "reason", "step", "by", "<|system|>"]
WORDS += ["<|user|>", "<|assistant|>", "a", "b", "c", "d", "e"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def word_tokenizer(chat_template: str | None = None) -> PreTrainedTokenizerFast:
    core = Tokenizer(WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = chat_template
    return tokenizer


def write_jsonl(path: Path, rows: list[dict | str]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def make_records(n: int) -> list[PromptRecord]:
    return [PromptRecord(prompt=f"p{i}", prompt_ids=[i], columns={"answer": str(i)}, index=i) for i in range(n)]


# ----------------------------------------------------------------------------------------------- readers / bad input


def test_read_jsonl_columns_and_blank_lines(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"prompt": "one plus two", "answer": "3", "level": 2}, "", {"prompt": "a", "answer": "1"}],
    )
    examples = read_jsonl(path)
    assert [e.question for e in examples] == ["one plus two", "a"]
    assert examples[0].columns == {"answer": "3", "level": 2} and examples[1].index == 1


def test_malformed_jsonl_line_names_file_and_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "a", "answer": "1"}, '{"prompt": "b", "answer": '])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: malformed JSON"):
        read_jsonl(path)


def test_missing_answer_column_names_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": "b"}])
    with pytest.raises(ValueError, match=r"d\.jsonl:2: missing field\(s\) \['answer'\]"):
        read_jsonl(path)


def test_empty_dataset_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(ValueError, match="empty.jsonl: the dataset is empty"):
        read_jsonl(path)


def test_read_parquet_and_missing_column(tmp_path: Path) -> None:
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": ["1", "2"], "extra": [1, 2]}), path)
    assert [(e.question, e.columns) for e in read_parquet(path)] == [
        ("a", {"answer": "1", "extra": 1}),
        ("b", {"answer": "2", "extra": 2}),
    ]
    pq.write_table(pa.table({"prompt": ["a"]}), path)
    with pytest.raises(ValueError, match=r"d\.parquet: missing column\(s\) \['answer'\]"):
        read_parquet(path)


def test_disk_source_needs_datasets_or_reads_it(tmp_path: Path) -> None:
    try:
        import datasets
    except ImportError:
        with pytest.raises(ImportError, match="needs the 'datasets' package"):
            read_disk_dataset(tmp_path, "train")
        return
    datasets.Dataset.from_dict({"prompt": ["a"], "answer": ["1"]}).save_to_disk(str(tmp_path / "ds"))
    assert [(e.question, e.columns) for e in read_disk_dataset(tmp_path / "ds", "train")] == [("a", {"answer": "1"})]


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"loader": {"prompts_per_step": 0}}, "--data.loader.prompts_per_step must be >= 1, got 0"),
        ({"source": "jsonl"}, "--data.files.train_path is required with --data.source jsonl"),
        ({"source": "jsonl", "files": {"train_path": "/nonexistent.jsonl"}}, "--data.files.train_path does not exist"),
        ({"source": "csv"}, "--data.source must be one of"),
        ({"prompts": {"too_long": "wrap"}}, "--data.prompts.too_long must be one of"),
        ({"loader": {"num_workers": -1}}, "--data.loader.num_workers must be >= 0"),
        ({"source": "reasoning_gym"}, "--data.reasoning_gym.name is required with --data.source reasoning_gym"),
        ({"maze": {"rows": 1, "cols": 1}}, "--data.maze.rows x cols must give at least two cells"),
    ],
)
def test_invalid_settings_name_the_flag(kwargs: dict, flag: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(flag)}"):
        PromptDataModule(**kwargs)


# ------------------------------------------------------------------------------------------------------- rendering


def test_plain_rendering_with_system_prompt_adds_bos() -> None:
    tokenizer = word_tokenizer()
    tokenizer._tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    [record] = render_records(
        [SourceExample("what is one plus two", {"answer": "3"})], tokenizer, 32, system_prompt="reason step by step"
    )
    assert record.prompt == "reason step by step\n\nwhat is one plus two"
    assert record.prompt_ids[0] == 1 and len(record.prompt_ids) == 10
    assert record.columns == {"answer": "3"}


def test_chat_template_rendering() -> None:
    tokenizer = word_tokenizer(CHAT_TEMPLATE)
    [record] = render_records([SourceExample("one plus two")], tokenizer, 32, system_prompt="reason step by step")
    assert record.prompt == "<|system|> reason step by step <|user|> one plus two <|assistant|>"
    assert tokenizer.convert_ids_to_tokens(record.prompt_ids)[-1] == "<|assistant|>"
    [conversation] = render_records([SourceExample([{"role": "user", "content": "a b"}])], tokenizer, 32)
    assert conversation.prompt == "<|user|> a b <|assistant|>"


def test_too_long_policies(caplog: pytest.LogCaptureFixture) -> None:
    tokenizer = word_tokenizer()
    examples = [SourceExample("a b", index=0), SourceExample("a b c d e", index=1), SourceExample("c d e a b", index=2)]
    with caplog.at_level(logging.WARNING):
        kept = render_records(examples, tokenizer, 3, "skip", source="toy")
    assert [r.index for r in kept] == [0]
    assert "toy: 2 of 3 prompts exceed --data.prompts.max_length=3 tokens and were skipped" in caplog.text
    truncated = render_records(examples, tokenizer, 3, "truncate_left")
    assert [r.prompt for r in truncated] == ["a b", "c d e", "e a b"] and all(len(r.prompt_ids) <= 3 for r in truncated)
    with pytest.raises(ValueError, match="prompt 1 has 5 tokens > --data.prompts.max_length=3 .raise it, or set "):
        render_records(examples, tokenizer, 3, "error")
    with pytest.raises(ValueError, match="all 2 prompts exceed"):
        render_records(examples[1:], tokenizer, 3, "skip")


def test_columns_per_completion_is_prompt_major() -> None:
    from lit_fgrpo.rollout import columns_per_completion

    records = make_records(2)
    assert columns_per_completion(records, 3) == {"answer": ["0", "0", "0", "1", "1", "1"]}


# --------------------------------------------------------------------------------------------------- the stream


def first_global_positions(streams: list[list[list[PromptRecord]]]) -> list[int]:
    return [r.index for batches in streams for batch in batches for r in batch]


def test_two_ranks_two_workers_cover_each_record_once_per_epoch() -> None:
    records, batch_size, world_size = make_records(24), 3, 2
    per_rank_batches = len(records) // (batch_size * world_size)  # one epoch
    seen: list[int] = []
    for rank in range(world_size):
        stream = PromptStream(records, batch_size, seed=7, rank=rank, world_size=world_size, count_yielded=False)
        loader = DataLoader(stream, batch_size=None, collate_fn=keep_batch, num_workers=2)
        batches = [batch for batch, _ in zip(loader, range(2 * per_rank_batches))]
        inline = PromptStream(records, batch_size, seed=7, rank=rank, world_size=world_size)
        assert [[r.index for r in b] for b in batches] == [
            [r.index for r in inline.batch(i)] for i in range(len(batches))
        ]
        seen += [r.index for b in batches for r in b]
    counts = Counter(seen)
    assert set(counts) == set(range(24)) and set(counts.values()) == {2}  # two epochs, each record once per epoch
    epoch0 = [
        r.index
        for rank in range(2)
        for i in range(per_rank_batches)
        for r in PromptStream(records, 3, seed=7, rank=rank, world_size=2).batch(i)
    ]
    epoch1 = [
        r.index
        for rank in range(2)
        for i in range(per_rank_batches, 2 * per_rank_batches)
        for r in PromptStream(records, 3, seed=7, rank=rank, world_size=2).batch(i)
    ]
    assert sorted(epoch0) == sorted(epoch1) == list(range(24)) and epoch0 != epoch1  # reshuffled


def test_uneven_epochs_still_cover_each_record_once() -> None:
    records = make_records(10)
    streams = [PromptStream(records, 2, seed=1, rank=r, world_size=2) for r in range(2)]
    positions = [[s.batch(i) for i in range(5)] for s in streams]  # 2 ranks x 5 batches x 2 = 20 = two epochs
    assert Counter(first_global_positions(positions)) == Counter({i: 2 for i in range(10)})


def test_state_dict_resume_continues_the_uninterrupted_stream() -> None:
    records = make_records(7)
    reference = [[r.index for r in b] for b, _ in zip(PromptStream(records, 3, seed=3), range(9))]
    first = PromptStream(records, 3, seed=3)
    got = [[r.index for r in b] for b, _ in zip(first, range(4))]
    state = first.state_dict()
    assert (state["epoch"], state["position"], state["next_batch"]) == (1, 5, 4)
    resumed = PromptStream(records, 3, seed=3)
    resumed.load_state_dict(state)
    got += [[r.index for r in b] for b, _ in zip(resumed, range(5))]
    assert got == reference
    with pytest.raises(ValueError, match="saved num_records=7, now 6"):
        PromptStream(make_records(6), 3, seed=3).load_state_dict(state)


def test_single_pass_stream_restarts_each_iteration() -> None:
    stream = PromptStream(make_records(5), 2, infinite=False)
    assert stream.num_batches() == 3
    assert [[r.index for r in b] for b in stream] == [[0, 1], [2, 3], [4]] == [[r.index for r in b] for b in stream]


# --------------------------------------------------------------------------------------------------- data module


class RecordingModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list[int]] = []

    def training_step(self, batch: list[PromptRecord], batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, list) and isinstance(batch[0], PromptRecord)
        self.seen.append([r.index for r in batch])
        return (self.weight**2).sum() + 1.0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(
    datamodule: PromptDataModule, max_steps: int, tmp_path: Path, ckpt_path: str | None = None
) -> tuple[L.Trainer, RecordingModule]:
    trainer = L.Trainer(
        max_steps=max_steps, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, default_root_dir=tmp_path, accelerator="cpu", devices=1,
    )  # fmt: skip
    module = RecordingModule()
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer, module


@pytest.mark.parametrize("num_workers", [0, 2])
def test_datamodule_resume_through_lightning_checkpoint(tmp_path: Path, num_workers: int) -> None:
    """Lightning fetches one batch ahead; the saved position must still be the next batch the step would see."""

    def datamodule() -> PromptDataModule:
        return PromptDataModule(
            source="maze", splits=SplitSettings(num_train=7, num_val=2, num_test=2), seed=5,
            loader=LoaderSettings(prompts_per_step=3, num_workers=num_workers),
        )  # fmt: skip

    _, uninterrupted = fit(datamodule(), 6, tmp_path)
    trainer, first = fit(datamodule(), 3, tmp_path)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    _, resumed = fit(datamodule(), 6, tmp_path, ckpt_path=str(tmp_path / "mid.ckpt"))
    assert len(uninterrupted.seen) == 6 and first.seen + resumed.seen == uninterrupted.seen


def test_maze_source_has_disjoint_splits_and_test_loader() -> None:
    dm = PromptDataModule(
        source="maze", splits=SplitSettings(num_train=30, num_val=5, num_test=5), loader={"prompts_per_step": 4}
    )
    dm.setup()
    prompts = {name: {r.prompt for r in records} for name, records in dm.splits.items()}
    assert [len(prompts[s]) for s in ("train", "val", "test")] == [30, 5, 5]
    assert not (
        prompts["train"] & prompts["val"] or prompts["train"] & prompts["test"] or prompts["val"] & prompts["test"]
    )
    record = dm.splits["train"][0]
    assert record.prompt.startswith("<bos> GRID_START") and record.columns["answer"].endswith("DONE <eos>")
    assert len(record.prompt_ids) == len(record.prompt.split())  # no second <bos>
    assert [len(b) for b in dm.test_dataloader()] == [4, 1]


def test_jsonl_source_holds_out_a_fixed_validation_set(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "a " * (i % 4 + 1), "solution": str(i)} for i in range(20)])
    dm = PromptDataModule(
        source="jsonl",
        files=FileSettings(train_path=str(path), prompt_field="question", answer_field="solution"),
        splits=SplitSettings(val_size=4),
        loader=LoaderSettings(prompts_per_step=2),
    )
    dm.set_tokenizer(word_tokenizer(CHAT_TEMPLATE))
    dm.setup()
    train, val = dm.splits["train"], dm.splits["val"]
    assert len(train) == 16 and len(val) == 4 and not {r.index for r in train} & {r.index for r in val}
    assert val[0].columns["answer"] == val[0].columns["solution"]
    assert [r.index for b in dm.val_dataloader() for r in b] == [r.index for r in val]


def test_reasoning_gym_source_by_name() -> None:
    pytest.importorskip("reasoning_gym")
    dm = PromptDataModule(
        source="reasoning_gym",
        reasoning_gym=ReasoningGymSettings(name="basic_arithmetic", dataset_size=6),
        splits=SplitSettings(val_size=2),
        prompts=PromptSettings(max_length=10_000),
        loader=LoaderSettings(prompts_per_step=2),
    )
    dm.set_tokenizer(word_tokenizer())
    dm.setup()
    assert len(dm.splits["train"]) == 6 and len(dm.splits["val"]) == 2
    record = dm.splits["train"][0]
    assert record.columns["entry"]["answer"] == record.columns["answer"]
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset 'no_such_task'"):
        bad = PromptDataModule(source="reasoning_gym", reasoning_gym={"name": "no_such_task"})
        bad.set_tokenizer(word_tokenizer())
        bad.setup()
