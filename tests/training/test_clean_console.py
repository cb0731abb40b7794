"""A clean console (issue 33, item 6): a run prints no deprecation warning from our own calls into libraries.

The smallest real paths that used to warn: a policy loaded with ``from_pretrained`` (``torch_dtype=``: transformers'
"`torch_dtype` is deprecated"; left in eval mode, also under LoRA: Lightning's "Found N module(s) in eval mode"),
gradient checkpointing with the supervised warm start (its forward asked for a KV cache: "`use_cache=True` is
incompatible with gradient checkpointing"), one RL step through Lightning (torch's ``LeafSpec`` FutureWarning from
Lightning's loader wrapping, filtered where it is raised), and the config dump of the MLflow callback (jsonargparse's
``skip_none``). Python warnings are recorded with every filter set to "always"; transformers' messages go through
its logger (``warning_once``), whose once-per-process cache is cleared first.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.training.tiny_setup import TINY_MODEL, maze_data, quiet_trainer, tiny_module, word_count_rollouts

FIXED_MESSAGES = (
    "`torch_dtype` is deprecated",
    "module(s) in eval mode",
    "`use_cache=True` is incompatible with gradient checkpointing",
    "`isinstance(treespec, LeafSpec)` is deprecated",
    "skip_none parameter was deprecated",
)
"""The messages this file guards (Python warnings or transformers log lines)."""


def _ours(filename: str) -> bool:
    return "/lit_fgrpo/" in filename or "/callbacks/" in filename


def noisy(records: list[warnings.WarningMessage], lines: list[str]) -> list[str]:
    """The recorded warnings a user should not see: deprecations raised at a line of ours, or a fixed message."""
    found = [
        f"{r.category.__name__} at {r.filename}:{r.lineno}: {r.message}"
        for r in records
        if (issubclass(r.category, (FutureWarning, DeprecationWarning)) and _ours(r.filename))
        or any(m in str(r.message) for m in FIXED_MESSAGES)
    ]
    return found + [f"transformers log: {line}" for line in lines if any(m in line for m in FIXED_MESSAGES)]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def transformers_lines() -> Iterator[list[str]]:
    """transformers' warning log lines while the test runs (its ``warning_once`` cache emptied first)."""
    from transformers.utils import logging as hf_logging

    hf_logging.warning_once.cache_clear()  # type: ignore[attr-defined]
    handler = _Lines()
    root = hf_logging.get_logger("transformers")
    root.addHandler(handler)
    try:
        yield handler.lines
    finally:
        root.removeHandler(handler)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny maze policy saved as a Hugging Face folder (loaded back through ``from_pretrained``)."""
    from transformers import AutoModelForCausalLM

    from lit_fgrpo.models.policy import load_tokenizer, policy_config

    folder = tmp_path_factory.mktemp("pretrained")
    config = policy_config(TINY_MODEL, load_tokenizer("builtin:maze"))
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


# LoRA without the warm start: the warm start restores the mode of the PEFT wrapper (train) on every module, which
# would hide that PEFT leaves the loaded base modules in eval mode.
@pytest.mark.parametrize(("lora", "warm_steps"), [(None, 2), ({"r": 2}, 0)], ids=["full+warm_start", "lora"])
def test_pretrained_policy_fit_with_checkpointing_warns_nothing(
    pretrained: Path, transformers_lines: list[str], lora: dict[str, int] | None, warm_steps: int
) -> None:
    from lit_fgrpo.callbacks import WarmStartCallback

    module = tiny_module(
        model=str(pretrained), model_config=None, tokenizer="builtin:maze", gradient_checkpointing=True, lora=lora
    )
    warm_start = [WarmStartCallback(steps=warm_steps, batch_size=8)] if warm_steps else []
    trainer = quiet_trainer(1, [word_count_rollouts(), *warm_start])
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        trainer.fit(module, datamodule=maze_data())
    assert noisy(records, transformers_lines) == []
    assert trainer.global_step == 1
    assert module.policy.training  # at rest in train mode, as Lightning expects at the start of fit


def test_config_dump_uses_no_deprecated_jsonargparse_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jsonargparse import ArgumentParser

    from lit_fgrpo.reporting.mlflow_logging import MLflowSaveConfigCallback

    monkeypatch.setenv("JSONARGPARSE_DEPRECATION_WARNINGS", "all")  # else jsonargparse shows one per process
    parser = ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--note", type=str | None, default=None)
    callback = MLflowSaveConfigCallback(parser, parser.parse_args([]))

    class Trainer:
        logger = type("Logger", (), {"log_dir": str(tmp_path)})()

    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        callback.save_config(Trainer(), None, "fit")
    assert noisy(records, []) == []
    text = (tmp_path / callback.config_filename).read_text()
    assert "steps: 3" in text and "note: null" in text  # None entries are kept, as skip_none=False kept them


def test_noisy_flags_what_it_guards() -> None:
    """The checker itself: a deprecation at a line of ours and a fixed message are flagged, others are not."""
    mine = warnings.WarningMessage("x", FutureWarning, "/repo/lit_fgrpo/policy.py", 1)
    theirs = warnings.WarningMessage("y", FutureWarning, "/site-packages/other/lib.py", 1)
    fixed = warnings.WarningMessage("Found 3 module(s) in eval mode at the start", UserWarning, "/lightning/a.py", 1)
    assert len(noisy([mine, theirs, fixed], ["`torch_dtype` is deprecated! Use `dtype` instead!"])) == 3
    assert noisy([theirs], ["something else"]) == []
