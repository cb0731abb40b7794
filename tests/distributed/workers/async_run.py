"""One rank of a 2-process DDP run with asynchronous rollouts (k = 1, each rank its own ``hf_copy`` engine).

Lightning's ``ddp`` launcher re-runs this script for rank 1. Every rank writes the prompt positions it trained on,
its logged staleness and versions, and its final weights.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from tests.callbacks.test_async_training import fit


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    trainer_kwargs = {"devices": 2, "strategy": "ddp"}
    policy, logger, trained = fit(out / "run", 3, max_staleness=1, trainer_kwargs=trainer_kwargs)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    summary = {
        "positions": trained.positions,
        "staleness": logger.series("rollout/staleness"),
        "versions": logger.series("rollout/policy_version"),
        "dropped": logger.series("rollout/dropped_stale"),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(summary))
    torch.save({k: v.detach().clone() for k, v in policy.state_dict().items()}, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
