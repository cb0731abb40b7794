"""Two gloo ranks of the conversation warm start give the one-process result (issue 49): same losses, same weights.

Reference: the same 3 steps in this process, with other micro-batches (4 rows each, rows only, against the ranks'
2 + 1 of a 1,600-token budget).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch

from lit_fgrpo.training.conversation_sft import conversation_warm_start
from tests.distributed.launch import WORKERS, base_env, run_processes
from tests.distributed.workers.conversation_sft_worker import SETTINGS
from tests.training.conversation_setup import chat_policy, pad_id, transcripts


def test_two_ranks_train_as_one_process(tmp_path: Path) -> None:
    out = tmp_path / "ranks.pt"
    env = base_env()
    commands = [
        ([sys.executable, str(WORKERS / "conversation_sft_worker.py"), str(out)],
         env | {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank)})
        for rank in range(2)
    ]  # fmt: skip
    for rank, (status, text) in enumerate(run_processes(commands, timeout=120)):
        assert status == 0 and "conversation warm start done" in text, f"rank {rank}:\n{text[-3000:]}"
    policy = chat_policy()
    single = conversation_warm_start(
        policy, transcripts(12), transcripts(3, seed=9), replace(SETTINGS, micro_batch_rows=4, micro_batch_tokens=None), pad_id(),
        progress_mode="off",
    )  # fmt: skip
    ranks = torch.load(out, weights_only=False)
    torch.testing.assert_close(ranks["losses"], single.losses, rtol=1e-5, atol=1e-6)
    assert sorted(ranks["held_out"]) == [0, 2, 3]
    torch.testing.assert_close(ranks["held_out"], single.held_out_losses, rtol=1e-5, atol=1e-6)
    for name, p in policy.named_parameters():
        torch.testing.assert_close(ranks["weights"][name], p.detach(), rtol=1e-4, atol=1e-6, msg=name)
