"""``PolicyUpdate``: one RL step on a scored rollout, without a Trainer.

Given a :class:`~lit_fgrpo.rollout.batch.RolloutBatch` of P prompts x G completions, :meth:`PolicyUpdate.step` runs

1. the advantages ``A = w(mu_hat, G) * (r - mean_g r) / (std_g r + eps)``, with the group weights and success rates
   they are built from, once (:func:`~lit_fgrpo.objectives.weighted_group_advantages`);
2. the old log-probs (only with ``num_iterations > 1`` or several mini-batches) and the reference's (``beta > 0``);
3. the plan of the step, once: the mini-batches of M prompts, their micro-batches and columns
   (:func:`~lit_fgrpo.training.micro_batches.plan_step`);
4. ``num_iterations`` (mu) passes over the ``ceil(P / M)`` mini-batches, one optimizer step per mini-batch:
   ``theta <- step(grad sum_micro share_m * L_m)``, where the micro-batch losses ``L_m`` with their shares add up
   exactly to the mini-batch's TRL loss (:mod:`lit_fgrpo.objectives.loss_types`);
5. the non-finite guard before each step, and the statistics to log, over all ranks
   (:func:`~lit_fgrpo.training.step_stats.step_stats`).

The optimizer and the process group come in as handles (:mod:`lit_fgrpo.training.update_handles`), so the same code
runs under :class:`~lit_fgrpo.training.module.FGRPOModule` and in a plain torch loop. Every collective of the step
goes through the :class:`~lit_fgrpo.distributed.collectives.Collectives` handle and is made on every rank in the same
order: the token sum (world > 1), the busiest rank's micro-batch count per mini-batch (world > 1), the non-finite
verdict per optimizer step (world > 1) and the statistics' gather (always).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from lit_fgrpo.distributed import per_rank_mini_batch
from lit_fgrpo.models.logprobs import TokenLogprobs, completion_logprobs, eval_mode, train_mode
from lit_fgrpo.objectives import AdvantageScale, GroupAdvantages, GroupWeight, LossType, weighted_group_advantages
from lit_fgrpo.objectives.loss_types import piece_aggregation, policy_loss, token_divisor
from lit_fgrpo.objectives.mismatch import truncated_importance_weights
from lit_fgrpo.objectives.objective_settings import ImportanceCorrection, ObjectiveSettings
from lit_fgrpo.reporting.timing import PhaseTimer
from lit_fgrpo.rollout.batch import RolloutBatch
from lit_fgrpo.training.micro_batches import MiniBatch, plan_step
from lit_fgrpo.training.step_stats import step_stats
from lit_fgrpo.training.update_handles import Collectives, NonFiniteGuard, OptimizerStep

if TYPE_CHECKING:
    from lit_fgrpo.training.module_settings import BatchingSettings, OptimizerSettings

Pieces = list[dict[str, Tensor]]
"""The detached statistics of each micro-batch (see :func:`~lit_fgrpo.training.step_stats.train_stats`)."""


@dataclass(frozen=True)
class UpdateSettings:
    """The objective and batching settings of the update, resolved (clips and group weight) from the module's
    checked groups by :meth:`of`."""

    loss_type: LossType
    """grpo, bnpo, dr_grpo, dapo, cispo or gspo: the surrogate and its token aggregation."""
    epsilon: float
    """Lower clip: the ratio is clipped to ``[1 - epsilon, 1 + epsilon_high]``."""
    epsilon_high: float
    """Upper clip."""
    beta: float
    """k3 KL coefficient; > 0 needs the reference's log-probs and trains every row."""
    scale_rewards: AdvantageScale
    """Divide the centred rewards by the group std, the batch std or nothing."""
    advantage_eps: float
    """Added to the std."""
    group_weight: GroupWeight
    """The per-group weight w(mu_hat, G) the advantages are multiplied by (focal with gamma, or another kind)."""
    importance_correction: ImportanceCorrection
    """Truncated importance sampling against the engine's sampling log-probs."""
    importance_cap: float
    """Cap C of the truncated importance weights."""
    num_iterations: int
    """Passes (mu) over the rollout; > 1 stores old log-probs."""
    mini_batch_prompts: int | None
    """Prompts per optimizer step over all ranks; None = one step per rollout."""
    micro_batch_rows: int
    """Rows per forward/backward."""
    micro_batch_tokens: int | None
    """Padded tokens per forward/backward (rows x (longest prompt + longest completion)); None = rows only."""
    logprob_chunk_rows: int
    """Rows per forward of the log-probs computed without grad."""
    skip_zero_advantage: bool
    """Leave out zero-advantage rows (only without KL: their loss and gradient are then 0)."""
    temperature: float
    """Sampling temperature, applied to the training logits."""
    max_grad_norm: float | None
    """Gradient-norm clip (None = off)."""

    @classmethod
    def of(
        cls, objective: ObjectiveSettings, batching: BatchingSettings, optimizer: OptimizerSettings
    ) -> UpdateSettings:
        """The update's view of the module's settings groups: the loss type's default clips and the focal weight
        of ``gamma`` filled in."""
        epsilon, epsilon_high = objective.clip
        o, b = objective, batching
        return cls(
            loss_type=o.loss_type, epsilon=epsilon, epsilon_high=epsilon_high, beta=o.beta, group_weight=o.weight,
            scale_rewards=o.scale_rewards, advantage_eps=o.advantage_eps, importance_correction=o.importance_correction,
            importance_cap=o.importance_cap, temperature=o.temperature, num_iterations=b.num_iterations,
            mini_batch_prompts=b.mini_batch_prompts, micro_batch_rows=b.micro_batch_rows,
            micro_batch_tokens=b.micro_batch_tokens,
            logprob_chunk_rows=b.logprob_chunk_rows, skip_zero_advantage=b.skip_zero_advantage,
            max_grad_norm=optimizer.max_grad_norm,
        )  # fmt: skip


@dataclass(frozen=True)
class UpdateResult:
    """What one :meth:`PolicyUpdate.step` returns to its caller."""

    loss: Tensor
    """() summed (share-scaled, detached) loss of every micro-batch of every optimizer step."""
    metrics: dict[str, float]
    """``train/*``, ``rollout/*`` and ``focal/*`` statistics of the step, over all ranks."""
    num_prompts: int
    """P of this rank's rollout (the logging batch size)."""


@dataclass
class PolicyUpdate:
    """The Trainer-free policy update of one rollout (see the module docstring for the steps)."""

    policy: nn.Module
    """The trained causal LM (a PEFT wrapper with LoRA)."""
    reference: nn.Module | None
    """The frozen reference of the KL term; None with LoRA, whose reference is the policy with its adapters
    disabled (read only when ``beta > 0``)."""
    settings: UpdateSettings
    """Objective and batching settings."""
    timer: PhaseTimer
    """Receives the old_logprobs, ref_logprobs, forward, backward, optimizer and log phases."""
    guard: NonFiniteGuard
    """Skips (and counts) optimizer steps whose loss or gradients are not finite."""
    device: torch.device | str
    """Where the rollout's tensors go."""

    def grouped(self, rollout: RolloutBatch) -> GroupAdvantages:
        """(P, G) group advantages weighted by ``settings.group_weight``, with the (P,) weights and success rates."""
        s = self.settings
        return weighted_group_advantages(
            rollout.rewards, s.group_weight, s.scale_rewards, rollout.correct, s.advantage_eps
        )

    def advantages(self, rollout: RolloutBatch) -> Tensor:
        """(P, G) group advantages, weighted by ``settings.group_weight``."""
        return self.grouped(rollout).advantages.to(self.device)

    def step(self, rollout: RolloutBatch, optimizer: OptimizerStep, comm: Collectives) -> UpdateResult:
        """Train on one rollout: ``num_iterations`` passes of mini-batch optimizer steps, and the step's statistics."""
        s = self.settings
        rollout = rollout.to(self.device)
        P, G = rollout.num_prompts, rollout.group_size
        grouped = self.grouped(rollout)  # advantages (P, G), weights and success rates (P,): once per step
        flat_adv = grouped.advantages.reshape(-1)  # (B,)
        mask = rollout.completion_mask  # (B, T)
        world = comm.world_size
        prompts_per_step = per_rank_mini_batch(s.mini_batch_prompts, world) or P
        num_minibatches = math.ceil(P / prompts_per_step)
        # In one pass with one optimizer step the live log-probs are the old ones: no extra forward (the
        # importance weights, row-local, are then computed per micro-batch from the live log-probs).
        needs_old = s.num_iterations > 1 or num_minibatches > 1
        train_old = self.old_logp(rollout) if needs_old else None  # (B, T)
        ref_logp = self.ref_logp(rollout) if s.beta > 0 else None  # (B, T)
        is_weights = None
        if s.importance_correction != "none" and rollout.sampling_logp is not None and train_old is not None:
            is_weights = truncated_importance_weights(
                train_old, rollout.sampling_logp, mask, s.importance_correction, s.importance_cap
            )  # (B, T) or (B, 1)
        global_tokens = mask.sum()
        if world > 1:
            global_tokens = comm.sum(global_tokens)
        num_items = token_divisor(global_tokens, world, num_minibatches)
        # The rows, micro-batches and columns of every mini-batch: the same in every pass.
        skip_zero = s.skip_zero_advantage and s.beta == 0
        busiest = comm.max if world > 1 else None
        T = rollout.completion_length
        plan = plan_step(
            flat_adv, rollout.attention_mask, T, G, prompts_per_step, s.micro_batch_rows, skip_zero, busiest,
            s.micro_batch_tokens,
        )  # fmt: skip

        agree = (lambda bad: comm.max(int(bad)) > 0) if world > 1 else None  # any rank non-finite: all skip
        pieces: Pieces = []
        trained_before = self.timer.total(("forward", "backward", "optimizer"))
        for iteration in range(s.num_iterations):
            for mini in plan:
                with self.timer.phase("optimizer"):
                    optimizer.zero_grad()
                step_pieces = self.accumulate(
                    rollout, mini, flat_adv, train_old, ref_logp, is_weights, num_items, optimizer.backward,
                    entropy=iteration == 0,
                )  # fmt: skip
                pieces.extend(step_pieces)
                step_loss = torch.stack([p["loss"] for p in step_pieces]).sum() if step_pieces else None
                with self.timer.phase("optimizer"):
                    # Checked before clipping: a NaN norm would spread to every gradient and hide the culprit's name.
                    # Over several ranks one all-reduce makes the verdict common (under FSDP2 each rank sees only its
                    # gradient shard): every rank skips (and, after max_nonfinite_skips in a row, stops) together.
                    if not self.guard.check(optimizer.steps_taken, step_loss, self.policy.named_parameters(), agree):
                        optimizer.zero_grad()  # no step, no scheduler step: the weights stay as they were
                        continue
                    if s.max_grad_norm is not None:
                        optimizer.clip(s.max_grad_norm)
                    optimizer.step()
        elapsed = self.timer.total(("forward", "backward", "optimizer")) - trained_before
        trained_tokens = sum(float(p["tokens"]) for p in pieces)
        self.timer.add_tokens("train", trained_tokens, phases=("forward", "backward"))
        with self.timer.phase("log"):
            values = step_stats(
                pieces, rollout, grouped, train_old, comm.gather, num_steps=s.num_iterations * num_minibatches,
                tokens_per_s=trained_tokens / max(elapsed, 1e-9), nonfinite_skips=self.guard.num_skipped,
            )  # fmt: skip
        loss = torch.stack([p["loss"] for p in pieces]).sum() if pieces else torch.zeros((), device=self.device)
        return UpdateResult(loss, values, P)

    def backward_on(self, rollout: RolloutBatch, backward: Callable[[Tensor], None], comm: Collectives) -> Pieces:
        """Forward/backward of a whole rollout as one mini-batch (one pass, one step), without an optimizer step.

        Gradients accumulate in the policy's ``.grad``. Returns the statistics of the micro-batches.
        """
        s = self.settings
        rollout = rollout.to(self.device)
        flat_adv = self.advantages(rollout).reshape(-1)  # (B,)
        ref_logp = self.ref_logp(rollout) if s.beta > 0 else None  # (B, T)
        num_items = token_divisor(rollout.completion_mask.sum(), 1, 1)
        busiest = comm.max if comm.world_size > 1 else None
        skip_zero = s.skip_zero_advantage and s.beta == 0
        T, G, P = rollout.completion_length, rollout.group_size, rollout.num_prompts
        (whole,) = plan_step(
            flat_adv, rollout.attention_mask, T, G, P, s.micro_batch_rows, skip_zero, busiest, s.micro_batch_tokens
        )
        return self.accumulate(rollout, whole, flat_adv, None, ref_logp, None, num_items, backward)

    def accumulate(
        self,
        rollout: RolloutBatch,
        mini: MiniBatch,
        flat_adv: Tensor,
        train_old: Tensor | None,
        ref_logp: Tensor | None,
        is_weights: Tensor | None,
        num_items: Tensor,
        backward: Callable[[Tensor], None],
        entropy: bool = True,
    ) -> Pieces:
        """Forward/backward over the micro-batches of the mini-batch ``mini``; the losses add up to its loss.

        The micro-batches come from :func:`lit_fgrpo.training.micro_batches.plan_step` (zero-advantage rows left
        out, rows sorted by length, each piece cut to its longest completion: the gradient is unchanged). The
        policy runs in train mode here, forwards and backwards alike (gradient checkpointing and dropout apply, also
        when a checkpointed forward is recomputed in the backward) and in eval mode everywhere else. ``entropy``
        computes the logged entropy (the first pass only; ``train/entropy`` averages the pieces that have it).
        """
        s = self.settings
        mask = rollout.completion_mask  # (B, T)
        mb_rows, mb_tokens = len(mini.rows), mask[mini.rows].sum()
        # Without stored old log-probs the live ones are the behaviour policy's: weights per micro-batch from them.
        live_correction = s.importance_correction if train_old is None else "none"
        pieces: Pieces = []
        with train_mode(self.policy):
            for micro in mini.micro_batches:
                chunk, width, kept = micro.rows, micro.width, micro.columns
                assert kept is not None, "plan_step gives every micro-batch its columns"
                cols = slice(0, width)
                m = mask[chunk][:, cols]  # (b, w)
                sampling_logp = rollout.sampling_logp[chunk][:, cols] if rollout.sampling_logp is not None else None
                with self.timer.phase("forward"):
                    ids, attn = (
                        rollout.input_ids[chunk][:, kept],
                        rollout.attention_mask[chunk][:, kept],
                    )  # (b, Tp' + w)
                    out = self.logp(self.policy, ids, attn, width, with_entropy=entropy)  # (b, w)
                    weights = is_weights[chunk][:, cols] if is_weights is not None else None  # (b, w) or (b, 1)
                    if live_correction != "none" and sampling_logp is not None:
                        weights = truncated_importance_weights(
                            out.logp.detach(), sampling_logp, m, live_correction, s.importance_cap
                        )
                    agg = piece_aggregation(s.loss_type, len(chunk), mb_rows, mb_tokens, num_items)
                    share = agg.share * (0.0 if micro.padding else 1.0)
                    loss, piece = policy_loss(
                        out.logp,
                        train_old[chunk][:, cols] if train_old is not None else None,
                        flat_adv[chunk],
                        m,
                        agg.loss_type,
                        s.epsilon,
                        s.epsilon_high,
                        ref_logp[chunk][:, cols] if ref_logp is not None else None,
                        s.beta,
                        max_completion_length=rollout.max_completion_length,
                        num_items=agg.num_items,
                        importance_weights=weights,
                    )
                with self.timer.phase("backward"):
                    backward(loss * share)
                if micro.padding:
                    continue  # no statistics
                piece["loss"] = (loss * share).detach()
                piece["tokens"] = m.sum()
                if out.entropy is not None:
                    piece["entropy_sum"] = (out.entropy * m).sum()
                if train_old is None and sampling_logp is not None:
                    # one pass, one step: the live log-probs are the behaviour policy's, so the mismatch is free
                    gap = (out.logp.detach() - sampling_logp).abs()  # (b, w)
                    piece["mismatch_sum"] = (gap * m).sum()
                pieces.append(piece)
        return pieces

    def logp(
        self,
        model: nn.Module,
        input_ids: Tensor,
        attention_mask: Tensor,
        completion_length: int,
        with_entropy: bool = False,
    ) -> TokenLogprobs:
        """(b, T) log-probs of the last ``completion_length`` tokens of the rows ``input_ids`` (b, Tp + T), at the
        training temperature; with grad one chunk of every row, without in chunks of ``logprob_chunk_rows``."""
        chunk_rows = max(1, len(input_ids)) if torch.is_grad_enabled() else self.settings.logprob_chunk_rows
        return completion_logprobs(
            model, input_ids, attention_mask, completion_length, temperature=self.settings.temperature,
            chunk_rows=chunk_rows, with_entropy=with_entropy,
        )  # fmt: skip

    @torch.no_grad()
    def old_logp(self, rollout: RolloutBatch) -> Tensor:
        """(B, T) log-probs of the policy before this step's updates (eval mode: no dropout)."""
        with self.timer.phase("old_logprobs"), eval_mode(self.policy):
            return self.logp(self.policy, rollout.input_ids, rollout.attention_mask, rollout.completion_length).logp

    @torch.no_grad()
    def ref_logp(self, rollout: RolloutBatch) -> Tensor:
        """(B, T) log-probs of the frozen reference (for LoRA: the policy with its adapters disabled)."""
        ids, attn, T = rollout.input_ids, rollout.attention_mask, rollout.completion_length
        with self.timer.phase("ref_logprobs"):
            if self.reference is None:
                with self.policy.disable_adapter(), eval_mode(self.policy):  # type: ignore[operator]
                    return self.logp(self.policy, ids, attn, T).logp
            return self.logp(self.reference, ids, attn, T).logp
