"""PassAtKReport, SampleTable and RNGStateCallback: their one job each, through public seams."""

from __future__ import annotations

import io
import json
import logging
import random
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from lit_fgrpo.callbacks import PassAtKReport, RNGStateCallback, SampleTable
from lit_fgrpo.callbacks.pass_at_k_report import format_report
from lit_fgrpo.callbacks.sample_table import sample_rows
from tests.training.tiny_setup import maze_data, synthetic_rollout, tiny_module, word_count_rollouts


def test_rng_state_round_trips_through_a_weights_only_checkpoint() -> None:
    callback = RNGStateCallback()
    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    buffer = io.BytesIO()
    torch.save({"callbacks": {"rng": callback.state_dict()}}, buffer)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)["callbacks"]["rng"]  # Lightning's default on resume
    restored = RNGStateCallback()
    restored.load_state_dict(state)
    torch.manual_seed(99), np.random.seed(99), random.seed(99)
    restored.on_train_start(None, None)  # type: ignore[arg-type]  # the hook reads neither
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]) and got[2] == expected[2]


def test_sample_rows_are_the_first_completions() -> None:
    rollout = synthetic_rollout(P=2, G=2)
    rollout.prompts, rollout.completions = ["p0", "p0", "p1", "p1"], ["a", "b", "c", "d"]
    table = sample_rows(rollout, step=5, rows=3)
    assert table["step"] == [5] * 3 and table["completion"] == ["a", "b", "c"]
    assert table["reward"] == [float(x) for x in rollout.rewards.reshape(-1)[:3]]
    with pytest.raises(ValueError, match="SampleTable"):
        SampleTable(every=-1)


def test_report_logs_before_and_after(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert format_report({"pass_at_1": 0.25}, {"pass_at_1": 0.5}).splitlines()[1].split() == [
        "pass_at_1",
        "0.250",
        "0.500",
    ]
    row = format_report({"pass_at_1": 0.25, "ci95_pass_at_1": 0.125}, {"pass_at_1": 0.5}).splitlines()[1]
    assert row.split() == ["pass_at_1", "0.250", "+-", "0.125", "0.500"]
    data = maze_data(num_train=32)
    rollouts = word_count_rollouts(validate_at_start=True)
    report = PassAtKReport()
    logger = L.pytorch.loggers.CSVLogger(tmp_path)
    trainer = L.Trainer(
        max_steps=2, val_check_interval=2, callbacks=[rollouts, report], logger=logger, enable_progress_bar=False,
        enable_checkpointing=False, num_sanity_val_steps=0,
    )  # fmt: skip
    with caplog.at_level(logging.INFO):
        trainer.fit(tiny_module(val_pass_at_k=[1, 4]), data)
    # the before values come from the callback's own evaluation, the after values from the module's metrics:
    # both carry each pass@k's interval over the held-out questions, and the two agree on the same kind of numbers
    keys = {"pass_at_1", "pass_at_4", "ci95_pass_at_1", "ci95_pass_at_4"}
    assert set(rollouts.start_pass_at_k) == set(report.after) == keys
    assert all(0 <= report.after[k] <= 1 for k in keys)
    assert "held-out pass@k" in caplog.text and " +- " in caplog.text
    saved = json.loads((Path(trainer.default_root_dir) / "pass_at_k.json").read_text())
    assert set(saved["before"]) == set(saved["after"]) == keys
    metrics = (Path(logger.log_dir) / "metrics.csv").read_text()
    assert "final/pass_at_1" in metrics and "final/start_pass_at_4" in metrics
