"""One rank of a raw gloo group running the conversation warm start (RANK, WORLD_SIZE, MASTER_* from the environment).

conversation_sft_worker.py OUT     3 steps on 12 calculator transcripts, 2 held out; rank 0 writes the trained weights,
                                   the losses and the held-out losses to OUT (torch.save)
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from lit_fgrpo.training.conversation_sft import ConversationSFTSettings, conversation_warm_start
from tests.training.conversation_setup import chat_policy, pad_id, transcripts

SETTINGS = ConversationSFTSettings(
    steps=3, batch_size=6, micro_batch_rows=3, micro_batch_tokens=1600, lr=1e-2, held_out=2, eval_every=2
)
"""Shared with the one-process run of tests/distributed/test_conversation_sft_ddp.py (there: other micro-batches).
A rank's 3 transcripts of ~770 tokens a step go as 2 + 1 under the 1,600-token budget."""


def main(out: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    policy = chat_policy()
    result = conversation_warm_start(
        policy, transcripts(12), transcripts(3, seed=9), SETTINGS, pad_id(), progress_mode="off"
    )
    if dist.get_rank() == 0:
        weights = {name: p.detach() for name, p in policy.named_parameters()}
        torch.save({"weights": weights, "losses": result.losses, "held_out": result.held_out_losses}, out)
    dist.barrier()
    dist.destroy_process_group()
    print("conversation warm start done")


if __name__ == "__main__":
    main(sys.argv[1])
