"""The ΔNLL_rare trajectory pool for mazes (paper App. M.2): base-policy correct samples on training mazes.

Sample many completions per training maze from the base (warm-started) policy, keep the correct ones, score each
by its length-normalised NLL under the base policy, and keep the whole pool: every trained policy is scored on the
same rows, and :func:`lit_fgrpo.theory.dnll_rare.delta_nll_rare` picks the top fraction by base NLL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lit_fgrpo.experiments.warm_start import maze_collector, maze_records
from lit_fgrpo.tasks.maze import Maze
from lit_fgrpo.theory.dnll_rare import delta_nll_rare, sequence_nll


@dataclass
class RarePool:
    """Correct base-policy trajectories, padded, with their base NLL."""

    input_ids: Tensor
    """(M, T) prompt + completion ids, right-padded."""
    attention_mask: Tensor
    """(M, T) 1 on real tokens."""
    completion_mask: Tensor
    """(M, T) 1 on completion tokens (moves and DONE)."""
    base_nll: Tensor
    """(M,) length-normalised NLL under the base policy."""
    num_sampled: int
    """Samples drawn in total (correct or not)."""

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def delta(self, model: nn.Module, top_fraction: float, batch_size: int = 256) -> tuple[float, float]:
        """``(ΔNLL_rare, mean ΔNLL over the whole pool)`` of ``model`` against the base; NaN for an empty pool."""
        if len(self) == 0:
            return float("nan"), float("nan")
        trained = score_nll(model, self, batch_size)  # (M,)
        rare = delta_nll_rare(self.base_nll, trained, top_fraction)
        return rare, float((trained.double() - self.base_nll.double()).mean())


@torch.no_grad()
def sample_correct_trajectories(
    model: Any, tokenizer: Any, mazes: Sequence[Maze], samples: int, chunk: int = 512, temperature: float = 1.0
) -> tuple[list[tuple[list[int], list[int]]], int]:
    """Sample ``samples`` completions per maze; return the correct ones as ``(prompt_ids, completion_ids)`` pairs.

    Samples through the library's one rollout path (:func:`~lit_fgrpo.experiments.warm_start.maze_collector`); a
    completion ends at (and includes) its first ``DONE``. Sampling uses the global torch RNG.

    Returns:
        The correct pairs (duplicates kept, as in the paper's protocol) and the number of samples drawn.
    """
    from lit_fgrpo.rollout import SamplingConfig

    done_id = int(tokenizer.convert_tokens_to_ids("DONE"))
    max_new = max(m.config.rows * m.config.cols for m in mazes) + 1
    sampling = SamplingConfig(n=samples, temperature=temperature, max_tokens=max_new, stop_token_ids=[done_id])
    rollout = maze_collector(model, tokenizer, chunk).collect(maze_records(tokenizer, mazes), sampling)
    correct = rollout.correct.reshape(-1).tolist()  # (B,)
    kept = [
        (rollout.prompt_ids[row // samples], completion)
        for row, completion in enumerate(rollout.completion_ids)
        if correct[row]
    ]
    return kept, len(correct)


def pack_pool(pairs: Sequence[tuple[list[int], list[int]]], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Right-pad ``(prompt, completion)`` pairs into ``input_ids``, ``attention_mask``, ``completion_mask``."""
    width = max((len(p) + len(c) for p, c in pairs), default=1)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)  # (M, T)
    attn = torch.zeros_like(ids)  # (M, T)
    comp = torch.zeros_like(ids)  # (M, T)
    for row, (prompt, completion) in enumerate(pairs):
        n, m = len(prompt), len(completion)
        ids[row, : n + m] = torch.tensor(prompt + completion, dtype=torch.long)
        attn[row, : n + m] = 1
        comp[row, n : n + m] = 1
    return ids, attn, comp


def score_nll(model: nn.Module, pool: RarePool, batch_size: int = 256) -> Tensor:
    """(M,) length-normalised NLL of the pool's completions under ``model`` (eval mode, restored after)."""
    was_training = model.training
    model.eval()
    nll = sequence_nll(model, pool.input_ids, pool.attention_mask, pool.completion_mask, batch_size)  # (M,)
    model.train(was_training)
    return nll


def build_rare_pool(
    model: Any, tokenizer: Any, mazes: Sequence[Maze], samples: int, chunk: int = 512, batch_size: int = 256
) -> RarePool:
    """Sample the base policy on ``mazes``, keep the correct trajectories and score their base NLL.

    Args:
        model: The base (warm-started) policy.
        tokenizer: The maze word tokenizer.
        mazes: Training mazes to sample on.
        samples: Completions per maze.
        chunk: Rows per ``generate`` call.
        batch_size: Rows per NLL forward pass.
    """
    pairs, drawn = sample_correct_trajectories(model, tokenizer, mazes, samples, chunk)
    ids, attn, comp = pack_pool(pairs, tokenizer.pad_token_id)
    pool = RarePool(ids, attn, comp, torch.zeros(len(pairs)), drawn)
    if pairs:
        pool.base_nll = score_nll(model, pool, batch_size)
    return pool
