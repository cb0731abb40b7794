"""One rank of a raw gloo group driving a :class:`RankedEngine` whose inner engine (rank 0's) is a fake.

The fake stands in for the servers because this checks the rounds' ordering logic only (who asks what, whose rows
come back, which errors reach which rank); the real servers under a real 2-rank Lightning run are
``tests/distributed/test_server_ddp.py``. The fake's samples are a pure function of (prompt, seed), as the servers'
are, so every rank can compute what asking alone would have given. Prints ``ranked engine ok`` when every check
passed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from lit_fgrpo.distributed import RankFailure
from lit_fgrpo.engines.base import Generation, RolloutEngine, SamplingConfig
from lit_fgrpo.engines.sync_check import WeightSyncError
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.rollout.engine_select import build_engine
from lit_fgrpo.servers import ServerError
from lit_fgrpo.servers.ranks import RankedEngine

SAMPLING = SamplingConfig(n=2, max_tokens=4, seed=11)


class FakeEngine(RolloutEngine):
    """Completion ``j`` of a prompt with seed ``s``: ``[s, len(prompt), prompt[0], j]``; records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail_check = False

    def generate(
        self, prompt_ids: list[list[int]], sampling: SamplingConfig, seeds: Sequence[int] | None = None
    ) -> Generation:
        self.calls.append(("generate", len(prompt_ids)))
        assert seeds is not None
        rows = [[int(s), len(p), p[0], j] for p, s in zip(prompt_ids, seeds) for j in range(sampling.n)]
        return Generation(rows, [[-0.5] * len(r) for r in rows], [True] * len(rows))

    def sync_weights(self, model: nn.Module) -> None:
        self.calls.append(("sync", int(model.weight.numel())))

    def last_push_metrics(self) -> dict[str, float]:
        return {"rollout/push_bytes": 123.0}

    def score(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float = 1.0
    ) -> list[torch.Tensor]:
        self.calls.append(("score", len(prompt_ids)))
        return [torch.full((len(c),), float(p[0])) for p, c in zip(prompt_ids, completion_ids)]

    def check_sync(self, prompt_ids: list[list[int]], completion_ids: list[list[int]], *rest: object) -> float:
        self.calls.append(("check", len(prompt_ids)))
        if self.fail_check:
            raise WeightSyncError("the probe is 0.5 off on vllm server http://127.0.0.1:1")
        return 0.25


def alone(prompts: list[list[int]], seeds: Sequence[int] | None) -> list[list[int]]:
    """What this rank would get asking the fake by itself (the seeds its own generate derives when None)."""
    own = list(seeds) if seeds is not None else [SAMPLING.seed + i * SAMPLING.n for i in range(len(prompts))]
    return FakeEngine().generate(prompts, SAMPLING, own).completion_ids


def expect(error: type[Exception], text: str, call: object) -> str:
    try:
        call()  # type: ignore[operator]
    except error as exc:
        assert text in str(exc) and "\n" not in str(exc), str(exc)
        return str(exc)
    raise AssertionError(f"no {error.__name__}")


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=45))
    rank = dist.get_rank()
    fake = FakeEngine()
    engine = RankedEngine.build(lambda: fake)
    assert isinstance(engine, RankedEngine) and (engine.inner is fake) == (rank == 0)
    # Rank 0 has 3 prompts, rank 1 has 2: one call on rank 0's engine, each rank its own rows.
    prompts = [[10 * rank + i + 1] * (i + 1) for i in range(3 - rank)]
    seeds = [100 * rank + 7 * i for i in range(len(prompts))]
    assert engine.generate(prompts, SAMPLING, seeds).completion_ids == alone(prompts, seeds)
    assert engine.generate(prompts, SAMPLING).completion_ids == alone(prompts, None)  # seeds derived per rank
    # Evaluation passes of different lengths: rank 1 ends after one batch and serves rank 0's two others.
    for _ in range(3 if rank == 0 else 1):
        assert engine.generate(prompts, SAMPLING, seeds).completion_ids == alone(prompts, seeds)
    engine.finish_rounds()
    # Dynamic sampling: rank 1 skips a round that rank 0 samples in.
    if rank == 0:
        assert engine.generate(prompts, SAMPLING, seeds).completion_ids == alone(prompts, seeds)
    else:
        engine.join_round(SAMPLING)
    # Scoring: every rank's rows, each rank its own back.
    scores = engine.score(prompts, [[1, 2]] * len(prompts))
    assert [s.tolist() for s in scores] == [[float(p[0])] * 2 for p in prompts]
    # Pushes: rank 0 alone pushes; every rank gets its metrics and the check's gap.
    engine.sync_weights(nn.Linear(2, 3 + rank))
    assert engine.last_push_metrics() == {"rollout/push_bytes": 123.0}
    assert engine.check_sync(prompts, prompts, [], 1e-3, "test") == 0.25
    # Generation from another thread (the asynchronous generator) while the main thread all-reduces on the default
    # group, as DDP does during the backward: the engine's own group keeps the two apart.
    got: list[list[list[int]]] = []
    thread = threading.Thread(target=lambda: got.append(engine.generate(prompts, SAMPLING, seeds).completion_ids))
    thread.start()
    total = torch.ones(1)
    dist.all_reduce(total)
    thread.join(30)
    assert float(total) == 2.0 and got == [alone(prompts, seeds)]
    # A failed check on rank 0 is the same one-line WeightSyncError on every rank.
    fake.fail_check = True
    expect(
        WeightSyncError,
        "the probe is 0.5 off on vllm server http://127.0.0.1:1",
        lambda: engine.check_sync(prompts, prompts, [], 1e-3, "test"),
    )
    # Ranks out of step (a push on rank 0, a rollout on rank 1): one error on both, naming both calls.
    out_of_step = engine.sync_weights if rank == 0 else lambda _: engine.generate(prompts, SAMPLING, seeds)
    expect(RankFailure if rank else RuntimeError, "rank 0 sync, rank 1 generate", lambda: out_of_step(nn.Linear(2, 2)))
    if rank == 0:  # one generate per sampling round, the ranks' prompts concatenated in rank order
        assert fake.calls == [
            ("generate", 5),
            ("generate", 5),
            ("generate", 5),
            ("generate", 3),
            ("generate", 3),
            ("generate", 3),
            ("score", 5),
            ("sync", 6),
            ("check", 3),
            ("generate", 5),
            ("check", 3),
        ], fake.calls

    # A build that fails on rank 0 fails on every rank with its message.
    def broken() -> RolloutEngine:
        raise ServerError("vllm server http://127.0.0.1:2 (log /tmp/server-0.log) never became healthy")

    expect(
        ServerError,
        "vllm server http://127.0.0.1:2 (log /tmp/server-0.log) never became healthy",
        lambda: RankedEngine.build(broken),
    )
    # A sharded (FSDP2) policy is refused on every rank before any server starts: rank 0 would gather it alone.
    from torch.distributed.fsdp import fully_shard

    sharded = fully_shard(nn.Sequential(nn.Linear(4, 4)))
    kwargs = {"launch": 1, "startup_timeout_s": 1}
    refused = lambda: build_engine("vllm_server", sharded, None, "/nonexistent", eos_token_id=0, **kwargs)  # noqa: E731
    expect(ConfigError, "--rollout.engine vllm_server cannot push a sharded policy", refused)
    dist.destroy_process_group()
    print("ranked engine ok")


if __name__ == "__main__":
    main()
