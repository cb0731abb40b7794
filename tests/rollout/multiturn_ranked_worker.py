"""One rank of a raw gloo group running multi-turn episodes on one engine the ranks share (:class:`RankedEngine`).

Rank 0 holds the engine (a scripted fake: what the servers do is pure in (prompt, seed)); rank 1's episodes end after
their first turn (the script says "stop" to its questions), rank 0's go on for ``max_turns``. The rounds are
collectives, so rank 1 must take part in each of rank 0's later turns, also in a dynamic-sampling skip
(:meth:`~lit_fgrpo.rollout.collect.RolloutCollector.join_round`). Each rank's episodes must equal those it gets from
the engine alone. Prints ``ranked episodes ok`` when every check passed.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from lit_fgrpo.engines.base import Generation, RolloutEngine
from lit_fgrpo.environments import TextEnvironment
from lit_fgrpo.rewards.last_number import last_number_reward
from lit_fgrpo.rollout import RolloutCollector
from lit_fgrpo.rollout.episodes import EpisodeRollouts
from lit_fgrpo.rollout.rollout_settings import RolloutSettings
from lit_fgrpo.servers.ranks import RankedEngine
from tests.environments.tiny_chat import ScriptedModel, chat_tokenizer
from tests.rollout.multiturn_setup import records, rollout_settings


class UntilStop(TextEnvironment):
    """A text environment that ends when the reply says "stop", else asks again."""

    def reset(self, **row: Any) -> None:
        pass

    def step(self, reply: str) -> tuple[str | None, bool]:
        return (None, True) if "stop" in reply else ("Again.", False)


def script(question: str, turn: int) -> str:
    return "stop" if "What is 2 + 3?" in question or "What is 3 + 4?" in question else f"go {turn}"


class Scripted(RolloutEngine):
    has_own_weights = True

    def __init__(self) -> None:
        self.model = ScriptedModel(script)

    def generate(self, prompt_ids: list[list[int]], sampling: Any, seeds: Any = None) -> Generation:
        rows = self.model(prompt_ids, [sampling.max_tokens] * len(prompt_ids), list(seeds))
        return Generation([r[0] for r in rows], [list(r[1] or []) for r in rows], [r[2] for r in rows])

    def sync_weights(self, model: Any) -> None:
        pass

    def score(self, prompt_ids: Any, completion_ids: Any, temperature: float = 1.0) -> Any:
        raise NotImplementedError


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=45))
    rank = dist.get_rank()
    settings = RolloutSettings(
        **rollout_settings(
            environment="tests.rollout.multiturn_ranked_worker:UntilStop", max_turns=3, max_turn_tokens=8,
            max_episode_tokens=64, reward_funcs=["last_number"],
        )
    )  # fmt: skip
    tokenizer = chat_tokenizer()
    shared = RankedEngine.build(Scripted)
    episodes = EpisodeRollouts.build(settings, tokenizer, policy=None)
    collector = RolloutCollector(shared, tokenizer, [last_number_reward], episodes=episodes)
    alone = RolloutCollector(Scripted(), tokenizer, [last_number_reward], episodes=episodes)
    mine = records(2, first=2 * rank)  # rank 0: 0 + 1, 1 + 2; rank 1: 2 + 3, 3 + 4 (its episodes stop at once)
    sampling = settings.train_sampling()
    batch = collector.collect(mine, sampling, step=1)
    turns = [sum(m["role"] == "assistant" for m in c) for c in batch.conversations]
    assert turns == ([3] * 8 if rank == 0 else [1] * 8), turns
    assert batch.completion_ids == alone.collect(mine, sampling, step=1).completion_ids
    # a dynamic-sampling round that rank 1 skips: it joins each of rank 0's max_turns rounds
    if rank == 0:
        again = collector.collect(mine, sampling, step=2)
        assert again.completion_ids == alone.collect(mine, sampling, step=2).completion_ids
    else:
        collector.join_round(sampling)
    dist.barrier()
    print(f"rank {rank}: ranked episodes ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
