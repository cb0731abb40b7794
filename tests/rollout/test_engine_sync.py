"""EngineSync on the real HF copy engine (weights of its own): push, check, staleness, probe, close."""

from __future__ import annotations

import pytest
import torch

from lit_fgrpo.engines.hf_copy import HFCopyEngine
from lit_fgrpo.engines.sync_check import WeightSyncError, default_sync_tolerance
from lit_fgrpo.rollout.engine_sync import EngineSync
from tests.training.tiny_setup import tiny_module

PROMPTS = [[4, 5, 6, 7], [8, 9, 10]]


def nudge(policy: torch.nn.Module, by: float = 0.05) -> None:
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(by * torch.randn_like(parameter))


def test_push_makes_the_copy_agree_and_an_unpushed_change_fails_the_check() -> None:
    module = tiny_module()
    policy, tokenizer = module.policy.eval(), module.tokenizer
    sync = EngineSync("hf_copy", {}, hf_chunk_size=64, sync_tolerance=1e-4, probe_rows=2)
    engine = sync.build(policy, tokenizer)
    assert isinstance(engine, HFCopyEngine) and sync.build(policy, tokenizer) is engine  # built once
    sync.probe_from_prompts(PROMPTS)
    assert sync.probe is not None and sync.probe[0] == PROMPTS and sync.probe[1] == [p[-8:] for p in PROMPTS]

    nudge(policy)  # the copy now holds other weights
    with pytest.raises(WeightSyncError, match=r"weight sync at step 3 \(sync_tolerance\)"):
        sync.check(policy, tokenizer, step=3)
    sync.stale = True
    assert sync.needs_push(step=3, evaluation_in_fit=False)
    metrics = sync.push(step=3)
    assert metrics["rollout/sync_logprob_delta"] <= 1e-4 and metrics["rollout/sync_seconds"] >= 0
    assert sync.last_sync_step == 3 and not sync.stale
    assert not sync.needs_push(step=3, evaluation_in_fit=True)
    assert sync.needs_push(step=4, evaluation_in_fit=True)  # evaluation after an unpushed optimizer step
    assert not sync.needs_push(step=4, evaluation_in_fit=False)  # training pushes on its own schedule
    sync.close()
    assert sync.engine is None


def test_the_probe_is_the_first_rows_of_the_last_rollout() -> None:
    sync = EngineSync("hf", {}, hf_chunk_size=64, sync_tolerance=1e-3, probe_rows=3)
    completions = [[1], [2], [3], [4], [5], [6]]
    sync.remember_probe(PROMPTS, completions, group_size=3)
    assert sync.probe == ([PROMPTS[0]] * 3, [[1], [2], [3]])
    sync.probe_from_prompts([[9, 9]])  # a probe from a rollout is kept
    assert sync.probe == ([PROMPTS[0]] * 3, [[1], [2], [3]])


def test_empty_prompts_make_no_probe() -> None:
    """Environment-owned data (``--data.source environment``) has empty prompts: nothing to force, no probe."""
    sync = EngineSync("hf", {}, hf_chunk_size=64, sync_tolerance=1e-3, probe_rows=2)
    sync.probe_from_prompts([[], []])
    assert sync.probe is None
    sync.probe_from_prompts([[], [7, 8]])
    assert sync.probe == ([[7, 8], [7, 8]], [[7, 8], [7, 8]])


def test_the_default_tolerance_follows_the_policy_dtype() -> None:
    """``sync_tolerance: null``: the tolerance follows the policy's dtype at the moment of the check (0.25 in bf16,
    1e-3 in float32, named in the message), and weights that were never pushed still fail at bf16. (Here the bf16
    copy runs the trainer's own kernels, so its gap is 0; the 0.013 gap that made the float32 tolerance fail came
    from a bf16-true FSDP run of maze_tiny, docs/RESULTS.md "The GPU check on one H200".)"""
    assert default_sync_tolerance(torch.float32) == 1e-3
    assert default_sync_tolerance(torch.bfloat16) == default_sync_tolerance(torch.float16) == 0.25

    module = tiny_module()
    policy, tokenizer = module.policy.eval(), module.tokenizer
    policy.to(torch.bfloat16)
    sync = EngineSync("hf_copy", {}, hf_chunk_size=64, sync_tolerance=None, probe_rows=2)
    sync.build(policy, tokenizer)
    sync.probe_from_prompts(PROMPTS)
    gap = sync.push(step=1)["rollout/sync_logprob_delta"]
    assert 0 <= gap <= 0.25
    nudge(policy, by=1.0)  # an unpushed change the size of the weights themselves
    with pytest.raises(WeightSyncError, match="> tolerance 0.25"):
        sync.check(policy, tokenizer, step=2)
    policy.float()
    nudge(policy, by=0.05)  # float32 now: the 1e-3 default catches a small unpushed change
    with pytest.raises(WeightSyncError, match="> tolerance 0.001"):
        sync.check(policy, tokenizer, step=3)
    sync.close()
