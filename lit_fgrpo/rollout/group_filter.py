"""Dynamic sampling (DAPO): oversample prompts, drop uninformative groups, refill until P informative groups.

A group is *uninformative* when every advantage in it is 0: its scorable rewards are all equal (or fewer than
two are scorable), or its group weight (:class:`~lit_fgrpo.objectives.group_weights.GroupWeight`, e.g. a
``band`` outside its range or ``maxrl`` on a group with no success) is 0. Such a group costs a forward and
backward pass and teaches nothing; with F-GRPO on easy data most groups are all-correct.

How it plugs in. :func:`dynamic_sample` receives a ``draw(k)`` callable that takes the next ``k`` prompts of the
data module's stream, generates and scores their groups and returns them as one :class:`RolloutBatch`; the
dynamic schedule (:func:`~lit_fgrpo.rollout.dynamic_schedule.dynamic_rollout`) builds it from
``RolloutParts.collect``::

    def draw(k: int) -> RolloutBatch:
        records = datamodule.draw_prompts(k)
        return parts.collector.collect(records, sampling, step=step + rounds * DYNAMIC_ROUND_SEED_OFFSET, stream=TRAIN_STREAM)

Data position: every prompt drawn is consumed, whether its group is kept, dropped or left over after P are
kept; the resume state advances by ``stats.prompts_drawn`` (not by P), so that a resumed run continues at the next
undrawn prompt and never replays a discarded one. Each round seeds its prompts with the step plus
``rounds * DYNAMIC_ROUND_SEED_OFFSET`` (each drawn prompt also carries its own stream position), so a resumed step
regenerates the same groups.

Wired in :class:`~lit_fgrpo.callbacks.RolloutCallback` (``dynamic_sampling=``), ``draw`` takes prompts from
:meth:`lit_fgrpo.data.PromptDataModule.draw_prompts`, whose cursor is checkpointed.

Several ranks (a :class:`Lockstep`): each rank draws from its own shard and needs its own P / W groups, but the
ranks must make the same rounds and draw the same number of prompts per round. The same rounds, because DDP's
training step after them is a collective; the same counts, because only rank 0's data-module state (the draw
cursor) goes into a checkpoint, and every rank resumes from it. So each round sizes itself on the rank that misses
the most groups (``Lockstep.round_need``, an all-reduce), and a rank that already has its P / W groups consumes the
round's prompts without generating them (``Lockstep.skip``): it would have waited for the busiest rank anyway.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from lit_fgrpo.distributed.collectives import global_maxes
from lit_fgrpo.objectives.group_weights import GroupWeight, group_weight_values
from lit_fgrpo.rollout.batch import RolloutBatch
from lit_fgrpo.rollout.collector_stats import keep_rate, merge_round_stats

DrawFn = Callable[[int], RolloutBatch]
"""``draw(k)``: generate and score the groups of the next k prompts; may return fewer at the end of the data."""


@dataclass(frozen=True)
class Lockstep:
    """How the ranks of a data-parallel run agree on the rounds (see the module docstring); None on one rank."""

    round_need: Callable[[int, bool], int]
    """``round_need(missing, exhausted)``: a collective over ranks; the most groups any rank still misses, or 0
    (stop) when none misses any or some rank's prompt stream ran out. Every rank calls it once per round."""
    skip: Callable[[int], int]
    """``skip(k)``: consume the next k prompts without generating (a rank that has its groups in a round another
    rank needs); returns how many were consumed. Must take part in whatever collectives ``draw`` does."""


def solo_round_need(missing: int, exhausted: bool) -> int:
    """:attr:`Lockstep.round_need` of a single rank: what it misses, or 0 once its stream ran out."""
    return 0 if exhausted else missing


def ranks_round_need(missing: int, exhausted: bool) -> int:
    """:attr:`Lockstep.round_need` over the ranks of the process group: one all-reduce (MAX) of both values."""
    most_missing, any_exhausted = global_maxes(missing, int(exhausted))
    return 0 if any_exhausted else most_missing


@dataclass(frozen=True)
class DynamicSampling:
    """Settings of dynamic sampling (validated on construction)."""

    max_rounds: int = 4
    """Most generation rounds per training step (DAPO's ``max_num_gen_batches``); >= 1."""
    oversample: float = 1.0
    """Each round draws ``ceil(oversample * missing)`` prompts, ``missing`` = P - groups kept so far; >= 1."""
    on_short: Literal["pad", "error"] = "pad"
    """After ``max_rounds`` with fewer than P informative groups: ``pad`` with dropped groups (advantage 0, no
    gradient; keeps ranks in lockstep) or raise ``error``."""

    def __post_init__(self) -> None:
        if self.max_rounds < 1:
            raise ValueError(f"dynamic_sampling.max_rounds must be >= 1, got {self.max_rounds}")
        if not math.isfinite(self.oversample) or self.oversample < 1.0:
            raise ValueError(f"dynamic_sampling.oversample must be finite and >= 1, got {self.oversample}")
        if self.on_short not in ("pad", "error"):
            raise ValueError(f"dynamic_sampling.on_short must be 'pad' or 'error', got {self.on_short!r}")


@dataclass(frozen=True)
class DynamicSamplingStats:
    """What one training step's dynamic sampling cost and kept."""

    rounds: int
    prompts_drawn: int
    """Prompts consumed from the stream (the data position advances by this)."""
    groups_informative: int
    """Informative groups seen over all rounds (may exceed P: the surplus is consumed and discarded)."""
    groups_kept: int
    """Informative groups in the returned batch (<= P)."""
    groups_padded: int
    """Uninformative groups added to reach P after ``max_rounds`` (``on_short="pad"``)."""
    prompts_skipped: int = 0
    """Of ``prompts_drawn``, those consumed without generation (several ranks: rounds another rank needed)."""

    def as_stats(self) -> dict[str, float]:
        """RolloutBatch.stats entries (the module logs them as ``rollout/dynamic_*``).

        Counts, summed over ranks when logged (:data:`~lit_fgrpo.rollout.collector_stats.SUMMED_STATS`), and the
        keep rate: informative groups per generated prompt (recomputed from the summed counts over ranks).
        """
        return {
            "dynamic_rounds": float(self.rounds),
            "dynamic_prompts_drawn": float(self.prompts_drawn),
            "dynamic_prompts_skipped": float(self.prompts_skipped),
            "dynamic_groups_informative": float(self.groups_informative),
            "dynamic_groups_kept": float(self.groups_kept),
            "dynamic_groups_padded": float(self.groups_padded),
            "dynamic_keep_rate": keep_rate(self.groups_informative, self.prompts_drawn, self.prompts_skipped),
        }


def informative_groups(
    rewards: Tensor, success: Tensor | None = None, group_weight: GroupWeight | None = None
) -> Tensor:
    """(P,) bool: the groups of ``rewards`` (P, G) whose advantages are not all 0.

    Same rule as :func:`~lit_fgrpo.objectives.group_advantages`: at least two scorable (non-NaN) rewards that are
    not all equal, and, when ``group_weight`` is given, a weight > 0 (mu_hat from ``success`` or reward > 0).
    """
    r = rewards.detach().to(torch.float64)  # (P, G)
    valid = ~torch.isnan(r)  # (P, G)
    big = torch.finfo(torch.float64).max
    r_max = torch.where(valid, r, torch.full_like(r, -big)).amax(dim=1)  # (P,)
    r_min = torch.where(valid, r, torch.full_like(r, big)).amin(dim=1)  # (P,)
    keep = (r_max > r_min) & (valid.sum(dim=1) >= 2)  # (P,)
    if group_weight is not None and not group_weight.is_identity:
        keep = keep & (group_weight_values(rewards, group_weight, success) > 0)
    return keep


def select_groups(batch: RolloutBatch, groups: Tensor | Sequence[int]) -> RolloutBatch:
    """The sub-batch of the given group (prompt) indices, in that order; texts and stats follow."""
    idx = torch.as_tensor(groups, dtype=torch.long).reshape(-1)  # (k,)
    G = batch.group_size
    rows = (idx.unsqueeze(1) * G + torch.arange(G)).reshape(-1)  # (k * G,)
    row_list = rows.tolist()
    return RolloutBatch(
        input_ids=batch.input_ids[rows.to(batch.input_ids.device)],
        attention_mask=batch.attention_mask[rows.to(batch.attention_mask.device)],
        completion_mask=batch.completion_mask[rows.to(batch.completion_mask.device)],
        rewards=batch.rewards[idx.to(batch.rewards.device)],
        correct=batch.correct[idx.to(batch.correct.device)],
        max_completion_length=batch.max_completion_length,
        sampling_logp=(
            batch.sampling_logp[rows.to(batch.sampling_logp.device)] if batch.sampling_logp is not None else None
        ),
        prompts=[batch.prompts[r] for r in row_list] if batch.prompts else [],
        completions=[batch.completions[r] for r in row_list] if batch.completions else [],
        prompt_ids=[batch.prompt_ids[p] for p in idx.tolist()] if batch.prompt_ids else [],
        completion_ids=[batch.completion_ids[r] for r in row_list] if batch.completion_ids else [],
        stats=dict(batch.stats),
        row_prompt_ids=[batch.row_prompt_ids[r] for r in row_list] if batch.row_prompt_ids else [],
        conversations=[batch.conversations[r] for r in row_list] if batch.conversations else [],
        faults=[batch.faults[r] for r in row_list] if batch.faults else [],
    )


def concat_rollouts(batches: Sequence[RolloutBatch], pad_token_id: int = 0) -> RolloutBatch:
    """Stack rollouts of the same group size along P, re-padding to the widest prompt and completion.

    Prompts stay left-padded and completions right-padded: row b of input k becomes
    ``[pad * (Tp - Tp_k), prompt, completion, pad * (T - T_k)]``. Padding ids are masked, so their value never
    matters.
    """
    if not batches:
        raise ValueError("concat_rollouts: no batches")
    G = batches[0].group_size
    if any(b.group_size != G for b in batches):
        raise ValueError(f"concat_rollouts: group sizes differ: {[b.group_size for b in batches]}")
    if len({b.sampling_logp is None for b in batches}) > 1:
        raise ValueError("concat_rollouts: some batches have sampling_logp and some do not")
    T = max(b.completion_length for b in batches)
    Tp = max(b.input_ids.shape[1] - b.completion_length for b in batches)
    ids, attn, mask, logp = [], [], [], []
    for b in batches:
        B, t = b.input_ids.shape[0], b.completion_length
        tp = b.input_ids.shape[1] - t
        new_ids = b.input_ids.new_full((B, Tp + T), pad_token_id)  # (B, Tp + T)
        new_ids[:, Tp - tp : Tp + t] = b.input_ids
        new_attn = b.attention_mask.new_zeros((B, Tp + T))  # (B, Tp + T)
        new_attn[:, Tp - tp : Tp + t] = b.attention_mask
        ids.append(new_ids)
        attn.append(new_attn)
        mask.append(torch.nn.functional.pad(b.completion_mask, (0, T - t)))  # (B, T)
        if b.sampling_logp is not None:
            logp.append(torch.nn.functional.pad(b.sampling_logp, (0, T - t)))  # (B, T)
    return RolloutBatch(
        input_ids=torch.cat(ids),
        attention_mask=torch.cat(attn),
        completion_mask=torch.cat(mask),
        rewards=torch.cat([b.rewards for b in batches]),
        correct=torch.cat([b.correct for b in batches]),
        max_completion_length=max(b.max_completion_length for b in batches),
        sampling_logp=torch.cat(logp) if logp else None,
        prompts=[p for b in batches for p in b.prompts],
        completions=[c for b in batches for c in b.completions],
        prompt_ids=[p for b in batches for p in b.prompt_ids],
        completion_ids=[c for b in batches for c in b.completion_ids],
        stats=merge_round_stats(batches),
        row_prompt_ids=[p for b in batches for p in b.row_prompt_ids],
        conversations=[c for b in batches for c in b.conversations],
        faults=[f for b in batches for f in b.faults],
    )


def dynamic_sample(
    draw: DrawFn,
    num_prompts: int,
    config: DynamicSampling | None = None,
    group_weight: GroupWeight | None = None,
    pad_token_id: int = 0,
    lockstep: Lockstep | None = None,
) -> tuple[RolloutBatch, DynamicSamplingStats]:
    """Draw rounds of prompts until ``num_prompts`` informative groups are kept or ``max_rounds`` is reached.

    Args:
        draw: ``draw(k)`` generates and scores the groups of the next k prompts (see the module docstring).
        num_prompts: P, the groups per training batch.
        config: rounds cap, oversampling factor and what to do when short.
        group_weight: also drop groups whose weight is 0 (a band, MaxRL with no success); None = only
            constant groups.
        pad_token_id: filler id for re-padding (masked, value irrelevant).
        lockstep: several ranks: how they agree on each round (None: this process alone).

    Returns:
        ``(batch, stats)``: exactly P groups in draw order (informative first, then, when short and
        ``on_short="pad"``, the earliest dropped groups), and the counts; ``batch.stats`` carries the
        per-round statistics merged over every round drawn, plus ``stats.as_stats()``.
    """
    cfg = config or DynamicSampling()
    if num_prompts < 1:
        raise ValueError(f"dynamic_sample: num_prompts must be >= 1, got {num_prompts}")
    kept: list[RolloutBatch] = []
    dropped: list[RolloutBatch] = []
    drawn_batches: list[RolloutBatch] = []
    rounds = drawn = skipped = informative = num_kept = 0
    exhausted = False
    round_need = lockstep.round_need if lockstep is not None else solo_round_need
    while rounds < cfg.max_rounds:
        need = round_need(num_prompts - num_kept, exhausted)  # (several ranks: the busiest one's)
        if need == 0:
            break
        want = math.ceil(cfg.oversample * need)
        rounds += 1
        if num_kept == num_prompts:  # this rank is done; another rank needs the round
            assert lockstep is not None
            consumed = lockstep.skip(want)
            drawn, skipped = drawn + consumed, skipped + consumed
            continue
        batch = draw(want)
        drawn += batch.num_prompts
        drawn_batches.append(batch)
        if batch.num_prompts == 0:  # the prompt stream is exhausted
            exhausted = True
            continue
        keep = informative_groups(batch.rewards, batch.correct, group_weight)  # (k,)
        informative += int(keep.sum())
        take = keep.nonzero().flatten()[: num_prompts - num_kept]  # (<= k,)
        num_kept += len(take)
        if len(take):
            kept.append(select_groups(batch, take))
        if num_kept < num_prompts and (~keep).any():
            dropped.append(select_groups(batch, (~keep).nonzero().flatten()))
    padded = 0
    if num_kept < num_prompts:
        if cfg.on_short == "error":
            raise RuntimeError(
                f"dynamic_sampling: {num_kept} informative groups of {num_prompts} after {rounds} rounds "
                f"({drawn} prompts drawn); raise dynamic_sampling.max_rounds or dynamic_sampling.oversample"
            )
        spare = concat_rollouts(dropped, pad_token_id) if dropped else None
        padded = min(num_prompts - num_kept, spare.num_prompts if spare is not None else 0)
        if spare is not None and padded:
            kept.append(select_groups(spare, torch.arange(padded)))
        if num_kept + padded < num_prompts:
            raise RuntimeError(
                f"dynamic_sampling: the prompt stream ran out after {drawn} prompts, fewer than the "
                f"{num_prompts} groups of a batch"
            )
    stats = DynamicSamplingStats(rounds, drawn, informative, num_kept, padded, skipped)
    out = concat_rollouts(kept, pad_token_id)
    out.stats = merge_round_stats(drawn_batches) | stats.as_stats()
    return out, stats
