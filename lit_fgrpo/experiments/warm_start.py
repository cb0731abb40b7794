"""The maze sweep's supervised warm start on target paths, and its pass@k evaluation by sampling.

RL needs a policy that already solves some mazes (pass@1 of about 0.1 or more), or almost no group has mixed
rewards. Budget the warm start by steps, not seconds: under CPU contention a time budget stops far too early.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Literal, cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lit_fgrpo.data.records import PromptRecord
from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.engines.hf import HFEngine
from lit_fgrpo.metrics import pass_at_k
from lit_fgrpo.rewards import maze_reward
from lit_fgrpo.rollout.collect import RolloutCollector, pad_id_of
from lit_fgrpo.tasks.maze import Maze, maze_prompt_tokens, maze_target_tokens
from lit_fgrpo.training.sft import supervised_warm_start

log = logging.getLogger(__name__)


def _ids(tokenizer: PreTrainedTokenizerBase, tokens: list[str]) -> list[int]:
    """Ids of a list of vocabulary words."""
    return cast(list[int], tokenizer.convert_tokens_to_ids(tokens))


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    mazes: Sequence[Maze],
    steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    log_every: int = 50,
    callback: Callable[[int, float], None] | None = None,
    schedule: Literal["constant", "cosine"] = "constant",
    weight_decay: float = 0.01,
) -> list[float]:
    """Teacher-forced training on the maze target paths (loss on target tokens only), in place.

    A maze-flavoured front end of :func:`lit_fgrpo.training.sft.supervised_warm_start` (the loop the
    ``WarmStartCallback`` uses too): prompt and target tokens are turned into ids, then trained on.

    Args:
        model: Causal LM to train.
        tokenizer: Word-level tokenizer of the maze vocabulary.
        mazes: Training pool; batches run through shuffled passes over it.
        steps: Number of optimizer steps.
        batch_size: Mazes per step.
        lr: AdamW peak learning rate.
        seed: Seed of the batch order.
        log_every: Log (and call ``callback``) every this many steps, and after the last.
        callback: Called as ``callback(step, loss)`` with the 1-based step and that step's loss.
        schedule: Constant learning rate, or cosine decay to zero over ``steps``.
        weight_decay: AdamW weight decay.

    Returns:
        The training loss of every step.
    """
    examples = [(_ids(tokenizer, maze_prompt_tokens(m)), _ids(tokenizer, maze_target_tokens(m))) for m in mazes]
    return supervised_warm_start(
        model,
        examples,
        steps,
        int(tokenizer.pad_token_id or 0),
        batch_size=batch_size,
        lr=lr,
        weight_decay=weight_decay,
        schedule=schedule,
        seed=seed,
        log_every=log_every,
        on_log=callback,
    )


def maze_records(tokenizer: PreTrainedTokenizerBase, mazes: Sequence[Maze]) -> list[PromptRecord]:
    """The mazes as :class:`~lit_fgrpo.data.records.PromptRecord` rows (prompt words, their ids)."""
    return [
        PromptRecord(
            prompt=" ".join(maze_prompt_tokens(m)),
            prompt_ids=_ids(tokenizer, maze_prompt_tokens(m)),
            columns={},
            index=i,
        )
        for i, m in enumerate(mazes)
    ]


def maze_collector(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, chunk: int = 512) -> RolloutCollector:
    """A :class:`~lit_fgrpo.rollout.collect.RolloutCollector` on ``model`` (HF engine) judged by the maze reward."""
    engine = HFEngine(model, pad_id_of(tokenizer), int(tokenizer.eos_token_id), chunk_size=chunk)
    return RolloutCollector(engine, tokenizer, [maze_reward])


@torch.no_grad()
def evaluate_pass_at_k(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    mazes: Sequence[Maze],
    n: int,
    ks: Sequence[int] = (1,),
    temperature: float = 1.0,
    chunk: int = 512,
    greedy: bool = True,
    max_new_tokens: int | None = None,
) -> dict[str, float]:
    """Sample ``n`` completions per maze, judge them exactly, and estimate pass@k (unbiased, Chen et al.).

    Samples through the library's one rollout path (:class:`~lit_fgrpo.rollout.collect.RolloutCollector` on an
    HF engine). Generation stops at ``DONE`` or ``<eos>``. Sampling uses the global torch RNG: seed it
    beforehand for a reproducible estimate.

    Args:
        model: Causal LM (left in its current mode; sampled in eval mode).
        tokenizer: Word-level tokenizer of the maze vocabulary.
        mazes: Mazes to evaluate.
        n: Samples per maze.
        ks: Values of k (each at most ``n``); ``pass_at_1`` is always reported.
        temperature: Sampling temperature.
        chunk: Rows per ``generate`` call (512 was fastest on a 2-core CPU).
        greedy: Also report ``greedy_accuracy`` from one greedy decode per maze (top-k 1).
        max_new_tokens: Completion cap; by default the longest possible path (cells - 1), ``DONE`` and ``<eos>``.

    Returns:
        ``{"pass_at_1": ..., "pass_at_{k}": ..., "greedy_accuracy": ...}`` averaged over mazes.
    """
    if any(k < 1 or k > n for k in ks):
        raise ValueError(f"every k must be in [1, n={n}], got {list(ks)}")
    if max_new_tokens is None:
        max_new_tokens = max(m.config.rows * m.config.cols for m in mazes) + 1
    collector = maze_collector(model, tokenizer, chunk)
    records = maze_records(tokenizer, mazes)
    stops = [_ids(tokenizer, ["DONE"])[0]]
    sampling = SamplingConfig(n=n, temperature=temperature, top_k=-1, max_tokens=max_new_tokens, stop_token_ids=stops)
    correct = collector.collect(records, sampling).correct.sum(dim=1)  # (M,)
    num_samples = torch.full_like(correct, n)  # (M,)
    metrics = {f"pass_at_{k}": float(pass_at_k(num_samples, correct, k).float().mean()) for k in sorted({1, *ks})}
    if greedy:
        top1 = SamplingConfig(n=1, top_k=1, max_tokens=max_new_tokens, stop_token_ids=stops)
        metrics["greedy_accuracy"] = float(collector.collect(records, top1).correct.float().mean())
    return metrics
