"""Scoring completions with TRL-style reward functions, failure-tolerant, plus the correctness verdict behind mu_hat.

A reward function is ``f(prompts, completions, **columns) -> list[float | None]``; every argument is a list with
one entry per completion (B rows). ``None`` means "cannot score this row". As in TRL, the total reward is the
weighted sum over functions that skips ``None`` (NaN), and is NaN only when every function gave ``None``.

Unscorable rows: a function that raises, returns ``None``, NaN or +-inf, times out (``reward_timeout``), or crashes
its worker process (``reward_isolation="process"``) makes that row ``None`` for that function; the rows are counted in
:attr:`RewardResult.num_failed` and logged, and an all-``None`` row gets advantage 0 downstream. A non-finite reward
never reaches the advantages.

A function that returns a list of the wrong length for its batch is scored row by row instead, with one warning per
batch naming it and the two lengths, counted in :attr:`RewardResult.num_wrong_length` (``rollout/reward_wrong_length``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from lit_fgrpo.reporting.notices import notice
from lit_fgrpo.rewards.guarded_call import Isolation, RewardCrash, RewardTimeout, call_with_timeout

log = logging.getLogger(__name__)


class RewardFn(Protocol):
    """``(prompts, completions, **columns) -> list[float | None]`` with per-completion lists of length B."""

    def __call__(self, prompts: list[str], completions: list[str], **columns: list[Any]) -> list[float | None]: ...


@dataclass
class RewardResult:
    """Scores of B completions."""

    rewards: Tensor
    """(B,) float32 weighted NaN-aware sum of the reward functions; NaN where every function gave ``None``."""
    correct: Tensor
    """(B,) bool verdict ``correctness >= threshold``; ``False`` where the verdict was ``None``."""
    per_function: dict[str, Tensor]
    """Reward-function name -> (B,) float32 values, NaN for ``None``."""
    num_failed: dict[str, int]
    """Reward-function name -> rows it raised on or returned ``None``/NaN for."""
    num_unjudged: int = 0
    """Rows whose correctness verdict was ``None`` (counted as incorrect)."""
    num_nonfinite: dict[str, int] = field(default_factory=dict)
    """Reward-function name -> rows it returned NaN or +-inf for (also counted in ``num_failed``)."""
    num_timed_out: dict[str, int] = field(default_factory=dict)
    """Reward-function name -> rows whose call timed out or crashed its worker (also counted in ``num_failed``)."""
    num_wrong_length: dict[str, int] = field(default_factory=dict)
    """Reward-function name -> 1 if its batch call returned the wrong number of values (then scored row by row)."""

    def stats(self, scorable: Tensor | None = None) -> dict[str, float]:
        """The counts (non-finite, timed-out and wrong-length values, failed calls per function) and each reward
        function's mean over the rows, as the collector logs them; ``scorable`` (B,) bool keeps only those rows in the
        means (an unscorable episode's value is not the function's)."""
        out = {
            "reward_nonfinite": float(sum(self.num_nonfinite.values())),
            "reward_timeouts": float(sum(self.num_timed_out.values())),
            "reward_wrong_length": float(sum(self.num_wrong_length.values())),
        }
        out |= {f"failed_{name}": float(count) for name, count in self.num_failed.items()}
        for name, values in self.per_function.items():
            kept = (values if scorable is None else values[scorable]).float()  # (V,)
            out[f"reward_{name}"] = float(torch.nanmean(kept)) if kept.numel() else 0.0
        return out


class RewardLengthError(ValueError):
    """A reward function returned a list whose length is not its batch's number of completions."""


def reward_name(fn: Any) -> str:
    """A reward function's name for logs: ``__name__``, else its class name."""
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


_NONFINITE = object()
"""Marks a NaN/inf value until it is counted and turned into ``None``."""


def _as_score(value: Any) -> Any:
    if value is None:
        return None
    score = float(value)
    return score if math.isfinite(score) else _NONFINITE


def _call_checked(fn: RewardFn, prompts: list[str], completions: list[str], columns: dict[str, list[Any]]) -> list[Any]:
    return [_as_score(v) for v in fn(prompts, completions, **columns)]


def _call_guarded(
    fn: RewardFn,
    prompts: list[str],
    completions: list[str],
    columns: dict[str, list[Any]],
    timeout: float | None,
    isolation: Isolation,
) -> list[Any]:
    scores = call_with_timeout(lambda: _call_checked(fn, prompts, completions, columns), timeout, isolation)
    if len(scores) != len(completions):  # checked here, not in a worker process, to keep the error's type
        raise RewardLengthError(f"returned {len(scores)} values for {len(completions)} completions")
    # A worker process cannot send the sentinel object back as itself: it arrives as a copy.
    return [_NONFINITE if s is not None and not isinstance(s, float) else s for s in scores]


def run_reward(
    fn: RewardFn,
    prompts: list[str],
    completions: list[str],
    columns: dict[str, list[Any]],
    timeout: float | None = None,
    isolation: Isolation = "thread",
    counts: dict[str, int] | None = None,
    group_size: int | None = None,
) -> tuple[list[float | None], int]:
    """Call ``fn`` on the batch; if it raises or times out, retry row by row so that only failing rows get ``None``.

    Args:
        fn: The reward function.
        prompts: (B,) prompts.
        completions: (B,) completions.
        columns: Name -> (B,) values.
        timeout: Seconds each call may take (the batch call, then each row's); ``None`` = no limit.
        isolation: ``"thread"`` or ``"process"`` (see :mod:`lit_fgrpo.rewards.guarded_call`); ``"process"`` forks a
            worker with or without a timeout, so a function that kills its process only costs its rows.
        counts: If given, receives ``"nonfinite"`` and ``"timed_out"`` row counts and ``"wrong_length"`` (1 if the
            batch call returned the wrong number of values).
        group_size: Completions per prompt (rows ``p * G`` to ``p * G + G - 1`` belong to prompt ``p``); when given,
            the warning names the prompt indices of the failing rows too.

    Returns:
        The (B,) scores and the number of ``None`` rows (raised, ``None``, non-finite, timed out or crashed).
        Failures are logged as warnings, never raised.
    """
    name = reward_name(fn)
    num_timed_out = wrong_length = 0
    try:
        scores = _call_guarded(fn, prompts, completions, columns, timeout, isolation)
    except Exception as batch_error:  # a reward function must never crash training
        if isinstance(batch_error, RewardLengthError):
            wrong_length = 1
            notice(
                log,
                "reward %r %s (it must return one value per completion): scoring this batch row by row",
                name,
                batch_error,
            )
        else:
            log.info("reward %r failed on a batch of %d (%r); retrying per completion", name, len(prompts), batch_error)
        scores = []
        last_error: Exception | None = None
        failed_rows: list[int] = []
        for i in range(len(prompts)):
            row_columns = {key: values[i : i + 1] for key, values in columns.items()}
            try:
                scores.extend(
                    _call_guarded(fn, prompts[i : i + 1], completions[i : i + 1], row_columns, timeout, isolation)
                )
            except Exception as row_error:
                scores.append(None)
                failed_rows.append(i)
                last_error = row_error
                num_timed_out += isinstance(row_error, RewardTimeout | RewardCrash)
        num_raised = sum(score is None for score in scores)
        if last_error is not None:
            of_prompts = f" of prompts {_rows(sorted({i // group_size for i in failed_rows}))}" if group_size else ""
            notice(
                log,
                "reward %r failed on %d of %d completions, rows %s%s (%d timed out or crashed; last: %r): unscorable",
                name,
                num_raised,
                len(prompts),
                _rows(failed_rows),
                of_prompts,
                num_timed_out,
                last_error,
            )
    num_nonfinite = sum(score is _NONFINITE for score in scores)
    if num_nonfinite:
        notice(
            log, "reward %r returned NaN or inf for %d of %d completions: unscorable", name, num_nonfinite, len(scores)
        )
    clean: list[float | None] = [None if s is _NONFINITE else s for s in scores]
    if counts is not None:
        counts["nonfinite"], counts["timed_out"], counts["wrong_length"] = num_nonfinite, num_timed_out, wrong_length
    return clean, sum(score is None for score in clean)


def _rows(indices: Sequence[int], shown: int = 8) -> str:
    """``"1, 4, 9"`` (the first ``shown``, then ``"... (12 in all)"``): which completions of the batch failed."""
    text = ", ".join(map(str, indices[:shown]))
    return text if len(indices) <= shown else f"{text}, ... ({len(indices)} in all)"


def _to_tensor(scores: Sequence[float | None]) -> Tensor:
    return torch.tensor([math.nan if s is None else s for s in scores], dtype=torch.float32)


def score_completions(
    prompts: Sequence[str],
    completions: Sequence[str],
    columns: dict[str, Sequence[Any]],
    reward_funcs: Sequence[RewardFn],
    weights: Sequence[float] | None = None,
    correctness_fn: RewardFn | None = None,
    correct_threshold: float = 0.5,
    reward_timeout: float | None = None,
    reward_isolation: Isolation = "thread",
    group_size: int | None = None,
) -> RewardResult:
    """Score B completions with several weighted reward functions and one correctness verdict.

    Args:
        prompts: (B,) prompt texts (repeat each prompt for each of its completions).
        completions: (B,) completion texts.
        columns: Name -> (B,) per-completion values (answer, entry, completion_length, ...).
        reward_funcs: The reward functions; names in the result come from :func:`reward_name` (``#2`` etc. for
            repeats).
        weights: One weight per function (default all 1.0).
        correctness_fn: The verdict that defines mu_hat, kept apart from shaping terms. If it is one of
            ``reward_funcs`` its values are reused; ``None`` judges by the total reward.
        correct_threshold: A row is correct when the verdict is ``>= correct_threshold``.
        reward_timeout: Seconds one reward call may take before its rows become unscorable; ``None`` = no limit.
        reward_isolation: ``"thread"`` (thread-safe functions) or ``"process"`` (not thread-safe, e.g. math-verify's
            signal-based timeout, or able to crash the interpreter); ``"process"`` forks a worker with or without
            ``reward_timeout``.
        group_size: Completions per prompt, to name the prompts of failing rows in the warning (None: rows only).

    Raises:
        ValueError: If lengths disagree or no reward function is given (caller errors, not reward failures).
    """
    batch_size = len(completions)
    if len(prompts) != batch_size:
        raise ValueError(f"score_completions: {len(prompts)} prompts for {batch_size} completions")
    for key, values in columns.items():
        if len(values) != batch_size:
            raise ValueError(f"score_completions: column {key!r} has {len(values)} rows, expected {batch_size}")
    if not reward_funcs:
        raise ValueError("score_completions needs at least one reward function")
    weights = [1.0] * len(reward_funcs) if weights is None else list(weights)
    if len(weights) != len(reward_funcs):
        raise ValueError(f"score_completions: {len(weights)} weights for {len(reward_funcs)} reward functions")
    prompt_list, completion_list = list(prompts), list(completions)
    column_lists = {key: list(values) for key, values in columns.items()}

    per_function: dict[str, Tensor] = {}
    num_failed: dict[str, int] = {}
    num_nonfinite: dict[str, int] = {}
    num_timed_out: dict[str, int] = {}
    num_wrong_length: dict[str, int] = {}
    guard = {"timeout": reward_timeout, "isolation": reward_isolation, "group_size": group_size}
    correctness_values: Tensor | None = None
    for fn in reward_funcs:
        name, suffix = reward_name(fn), 2
        while name in per_function:
            name, suffix = f"{reward_name(fn)}#{suffix}", suffix + 1
        counts: dict[str, int] = {}
        scores, failed = run_reward(fn, prompt_list, completion_list, column_lists, **guard, counts=counts)  # type: ignore[arg-type]
        per_function[name], num_failed[name] = _to_tensor(scores), failed
        num_nonfinite[name], num_timed_out[name] = counts["nonfinite"], counts["timed_out"]
        num_wrong_length[name] = counts["wrong_length"]
        if fn is correctness_fn and correctness_values is None:
            correctness_values = per_function[name]

    stacked = torch.stack(list(per_function.values()), dim=1)  # (B, K)
    weighted = stacked * torch.tensor(weights, dtype=torch.float32)
    rewards = torch.nansum(weighted, dim=1)
    rewards[torch.isnan(stacked).all(dim=1)] = math.nan

    if correctness_values is None:
        if correctness_fn is None:
            correctness_values = rewards
        else:
            verdicts, _ = run_reward(correctness_fn, prompt_list, completion_list, column_lists, **guard)  # type: ignore[arg-type]
            correctness_values = _to_tensor(verdicts)
    unjudged = torch.isnan(correctness_values)
    correct = (correctness_values >= correct_threshold) & ~unjudged
    return RewardResult(
        rewards, correct, per_function, num_failed, int(unjudged.sum()), num_nonfinite, num_timed_out, num_wrong_length
    )
