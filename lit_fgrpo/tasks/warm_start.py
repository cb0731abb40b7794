"""Supervised warm start on maze target paths, and pass@k evaluation by sampling.

RL needs a policy that already solves some mazes (pass@1 of about 0.1 or more), or almost no group has mixed
rewards. Budget the warm start by steps, not seconds: under CPU contention a time budget stops far too early.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal, cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lit_fgrpo.metrics import pass_at_k
from lit_fgrpo.sft import supervised_warm_start
from lit_fgrpo.tasks.maze import Maze, check_maze_completion, maze_prompt_tokens, maze_target_tokens

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

    A maze-flavoured front end of :func:`lit_fgrpo.sft.supervised_warm_start` (the loop the
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


@torch.no_grad()
def _generate(model: PreTrainedModel, prompts: torch.Tensor, stop_ids: list[int], pad_id: int, **kw) -> torch.Tensor:
    """Completions (without the prompt) of same-length prompts ``(B, P)``, as ``(B, L)`` ids."""
    out = model.generate(  # type: ignore[operator]
        input_ids=prompts,
        attention_mask=torch.ones_like(prompts),
        eos_token_id=stop_ids,
        pad_token_id=pad_id,
        **kw,
    )  # (B, P + L)
    return out[:, prompts.shape[1] :]


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

    Generation stops at ``DONE`` or ``<eos>``; the judge reads each completion up to its first stop token.
    Sampling uses the global torch RNG: seed it beforehand for a reproducible estimate.

    Args:
        model: Causal LM (left in its current mode; sampled in eval mode).
        tokenizer: Word-level tokenizer of the maze vocabulary.
        mazes: Mazes to evaluate.
        n: Samples per maze.
        ks: Values of k (each at most ``n``); ``pass_at_1`` is always reported.
        temperature: Sampling temperature.
        chunk: Rows per ``generate`` call (512 was fastest on a 2-core CPU).
        greedy: Also report ``greedy_accuracy`` from one greedy decode per maze.
        max_new_tokens: Completion cap; by default the longest possible path (cells - 1), ``DONE`` and ``<eos>``.

    Returns:
        ``{"pass_at_1": ..., "pass_at_{k}": ..., "greedy_accuracy": ...}`` averaged over mazes.
    """
    if any(k < 1 or k > n for k in ks):
        raise ValueError(f"every k must be in [1, n={n}], got {list(ks)}")
    device = next(model.parameters()).device
    stop_ids = _ids(tokenizer, ["DONE", str(tokenizer.eos_token)])
    if max_new_tokens is None:
        max_new_tokens = max(m.config.rows * m.config.cols for m in mazes) + 1
    was_training = model.training
    model.eval()
    by_length: dict[int, list[int]] = {}  # same-length prompts batch without padding
    prompt_ids = [_ids(tokenizer, maze_prompt_tokens(m)) for m in mazes]
    for i, p in enumerate(prompt_ids):
        by_length.setdefault(len(p), []).append(i)

    def judge(rows: list[int], completions: torch.Tensor) -> list[bool]:
        tokens = [tokenizer.convert_ids_to_tokens(c) for c in completions.tolist()]
        return [check_maze_completion(mazes[r], t) for r, t in zip(rows, tokens)]

    correct = torch.zeros(len(mazes), dtype=torch.long)  # (M,)
    greedy_correct = torch.zeros(len(mazes), dtype=torch.long)  # (M,)
    gen_kw: dict[str, Any] = {"max_new_tokens": max_new_tokens, "use_cache": True}
    sample_kw = {**gen_kw, "do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    for indices in by_length.values():
        rows = [i for i in indices for _ in range(n)]  # each maze n times
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            prompts = torch.tensor([prompt_ids[i] for i in part], device=device)  # (b, P)
            comp = _generate(model, prompts, stop_ids, tokenizer.pad_token_id, **sample_kw)  # (b, L)
            for i, ok in zip(part, judge(part, comp)):
                correct[i] += int(ok)
        if greedy:
            for start in range(0, len(indices), chunk):
                part = indices[start : start + chunk]
                prompts = torch.tensor([prompt_ids[i] for i in part], device=device)  # (b, P)
                comp = _generate(model, prompts, stop_ids, tokenizer.pad_token_id, do_sample=False, **gen_kw)  # (b, L)
                for i, ok in zip(part, judge(part, comp)):
                    greedy_correct[i] += int(ok)
    model.train(was_training)

    num_samples = torch.full_like(correct, n)  # (M,)
    metrics = {f"pass_at_{k}": float(pass_at_k(num_samples, correct, k).float().mean()) for k in sorted({1, *ks})}
    if greedy:
        metrics["greedy_accuracy"] = float(greedy_correct.float().mean())
    return metrics
