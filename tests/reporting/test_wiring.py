"""The reporting callbacks wired into a real Trainer run: what they record, what they write, what they print.

A tiny in-process ``fit`` (2 RL steps, one validation at the end) with a CSV logger, so the figures land as PNG
files in the log dir; the MLflow side of the same wiring is tests/reporting/test_mlflow_run.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import lightning as L
import pytest
from typing_extensions import override

from lit_fgrpo.callbacks import FocalFigureCallback, PassAtKReport, RLProgressBar, RolloutCallback
from lit_fgrpo.data import PromptDataModule
from lit_fgrpo.rollout import SamplingConfig
from lit_fgrpo.rollout.batch import PromptBatch
from tests.training.tiny_setup import tiny_module


class TrainedRollouts(L.Callback):
    """Spy: the (P, G) verdicts of each rollout as ``training_step`` receives it (after RolloutCallback)."""

    def __init__(self) -> None:
        self.groups: list[list[tuple[list[bool], list[float]]]] = []

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        assert isinstance(batch, PromptBatch) and batch.rollout is not None
        rollout = batch.rollout
        self.groups.append(list(zip(rollout.correct.tolist(), rollout.rewards.tolist(), strict=True)))


def _success_rate(correct: list[bool], rewards: list[float]) -> float:
    """Reference mu_hat: a loop over the group's scorable completions."""
    scored = [c for c, r in zip(correct, rewards, strict=True) if not math.isnan(r)]
    return sum(scored) / len(scored) if scored else math.nan


@pytest.fixture(scope="module")
def wired_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("wired")
    capture = pytest.MonkeyPatch()
    out = tmp / "stdout.txt"
    data = PromptDataModule(
        source="maze", splits={"num_train": 32, "num_val": 4, "num_test": 4, "val_size": 4},
        loader={"prompts_per_step": 4}, tokenizer_path="builtin:maze",
    )  # fmt: skip
    rollouts = RolloutCallback(
        sampling=SamplingConfig(n=4, max_tokens=8, stop_token_ids=[7]),
        val_samples=4,
        reward_funcs=["tests.training.tiny_setup:word_count_reward"],
    )
    spy, focal, report = TrainedRollouts(), FocalFigureCallback(), PassAtKReport()
    logger = L.pytorch.loggers.CSVLogger(tmp)
    trainer = L.Trainer(
        max_steps=2, val_check_interval=2, callbacks=[rollouts, spy, focal, report, RLProgressBar(mode="lines")],
        logger=logger, enable_checkpointing=False, num_sanity_val_steps=0,
    )  # fmt: skip
    with out.open("w") as stream:
        capture.setattr("sys.stdout", stream)  # the progress reporters write to sys.stdout, not a terminal
        capture.delenv("LIT_FGRPO_PROGRESS", raising=False)
        try:
            trainer.fit(tiny_module(val_pass_at_k=[1, 4], save_pretrained_dir=str(tmp / "policy")), data)
        finally:
            capture.undo()
    return {"spy": spy, "focal": focal, "report": report, "log_dir": Path(logger.log_dir), "tmp": tmp,
            "output": out.read_text()}  # fmt: skip


def test_focal_callback_reads_the_trained_rollout_from_the_batch(wired_run: dict[str, Any]) -> None:
    spy, focal = wired_run["spy"], wired_run["focal"]
    assert focal.steps == [1, 2]  # global_step after each RL step: the batch kept its rollout to batch end
    for groups, rates in zip(spy.groups, focal.success_rates, strict=True):
        reference = [_success_rate(correct, rewards) for correct, rewards in groups]
        assert rates.tolist() == pytest.approx(reference, nan_ok=True)


def test_figures_land_in_the_log_dir_and_the_report_names_the_pass_at_k_one(wired_run: dict[str, Any]) -> None:
    log_dir = wired_run["log_dir"]
    assert (log_dir / "figures" / "focal.png").stat().st_size > 0
    assert (log_dir / "figures" / "pass_at_k.png").stat().st_size > 0
    assert wired_run["report"].figure_location == str(log_dir / "figures" / "pass_at_k.png")


def test_policy_is_saved_without_mlflow(wired_run: dict[str, Any]) -> None:
    assert (wired_run["tmp"] / "policy" / "config.json").exists()  # log_policy: nothing to log to, no error


def test_every_pass_at_k_evaluation_prints_status_lines(wired_run: dict[str, Any]) -> None:
    output = wired_run["output"]
    assert re.search(r"^pass@k before RL: batch (\d+)/\1 \(100%\), \d\d:\d\d elapsed$", output, re.M), output
    # the evaluation stream has no len(): Lightning, and so the line, knows no total; the closing line counts all
    assert re.search(r"^pass@k at step 2: batch \d+, \d\d:\d\d elapsed$", output, re.M), output
    assert re.search(r"^RL: step 2/2 \(100%\), reward ", output, re.M), output
    assert "\r" not in output
