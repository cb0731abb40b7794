"""``FGRPOModule``: the policy, the frozen reference and the focal-weighted optimizer steps.

The module is glue over typed seams. Its batch is a :class:`~lit_fgrpo.rollout.batch.PromptBatch`
(``on_after_batch_transfer`` wraps the data module's ``list[PromptRecord]``); the
:class:`~lit_fgrpo.callbacks.RolloutCallback` attaches the scored :class:`~lit_fgrpo.rollout.batch.RolloutBatch`
to it in ``on_train_batch_start``, and ``training_step(batch)`` trains on ``batch.rollout`` through the public
:meth:`FGRPOModule.step_on`. Advantages come from :func:`lit_fgrpo.objectives.group_advantages`, the loss from
:func:`lit_fgrpo.objectives.policy_loss`, the micro-batch aggregation from :mod:`lit_fgrpo.objectives.aggregation`
and the logged statistics from :mod:`lit_fgrpo.objectives.diagnostics`. All G samples of a prompt stay on one
rank, so group statistics need no gather.

The policy (and the reference, LoRA, gradient checkpointing) is built in :meth:`configure_model`, which Lightning
calls under the strategy's init contexts (bf16 weights with ``precision="bf16-true"``); outside a Trainer the first
access to :attr:`policy` builds it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from typing_extensions import override

from lit_fgrpo.distributed import global_max, per_rank_mini_batch
from lit_fgrpo.distributed.full_copy import save_sharded_policy  # issue 24
from lit_fgrpo.distributed.rollout_stats import global_rollout_stats
from lit_fgrpo.distributed.strategy import shard_for_strategy  # issue 24
from lit_fgrpo.distributed.weight_gather import is_sharded  # issue 24
from lit_fgrpo.logprobs import completion_logprobs
from lit_fgrpo.metrics import PassAtK
from lit_fgrpo.micro_batches import padding_micro_batches, plan_micro_batches, trim_rows
from lit_fgrpo.objectives import AdvantageScale, GroupWeight, LossType, group_advantages
from lit_fgrpo.objectives.aggregation import clip_range, piece_aggregation, token_divisor
from lit_fgrpo.objectives.diagnostics import mismatch_stat, train_stats
from lit_fgrpo.objectives.hparam_checks import check_module_args
from lit_fgrpo.objectives.mismatch import truncated_importance_weights
from lit_fgrpo.objectives.nonfinite import NonFiniteGuard
from lit_fgrpo.objectives.policy_loss import policy_loss
from lit_fgrpo.policy import LoraSettings, apply_lora, build_policy, load_tokenizer, save_policy
from lit_fgrpo.reporting.artifacts import log_policy
from lit_fgrpo.rollout.batch import PromptBatch, RolloutBatch, as_prompt_batch
from lit_fgrpo.rollout.scoring import eval_mode, train_mode
from lit_fgrpo.timing import PhaseTimer

# The batch seam overrides on_after_batch_transfer on purpose while PromptDataModule (which does not) serves the
# data; Lightning warns about every module hook of that kind. This one is by design.
warnings.filterwarnings("ignore", message=r".*`on_after_batch_transfer` in `LightningModule`.*")

_HALF_PRECISIONS = {"bf16-true": torch.bfloat16, "16-true": torch.float16}


class FGRPOModule(L.LightningModule):
    """F-GRPO / F-DAPO / F-CISPO training of a causal LM on verifiable rewards.

    Args:
        model: local directory of a Hugging Face causal LM (give this or ``model_config``).
        model_config: an HF config as a dict (``{"model_type": "qwen2", "hidden_size": 128, ...}``) to build a
            fresh model from; vocab size and special ids default to the tokenizer's.
        tokenizer: tokenizer directory (defaults to ``model``), or ``builtin:maze``.
        gamma: focal exponent; the advantage of each group is scaled by (1 - mu_hat) ** gamma. 0 = base method.
        group_weight: another per-group weight w(mu_hat, G) in place of the focal one (``maxrl``, ``band``, a
            dotted path; see :mod:`lit_fgrpo.objectives.group_weights`); needs ``gamma: 0``. Assumes binary verdicts.
        loss_type: grpo, bnpo, dr_grpo, dapo, cispo or gspo (sets the clip defaults and the token aggregation).
        epsilon: lower clip (default by preset: 0.2, cispo 1.0).
        epsilon_high: upper clip (default by preset: 0.2, dapo 0.28, cispo 5.0).
        beta: k3 KL coefficient; > 0 keeps a frozen reference (for LoRA: the base with adapters disabled).
        scale_rewards: divide by the group std ("group"), the batch std ("batch") or not at all ("none").
        advantage_eps: added to the std (verl 1e-6, TRL 1e-4).
        num_iterations: passes over each rollout batch (mu); > 1 stores old log-probs.
        mini_batch_prompts: prompts per optimizer step over all ranks (global, like ``prompts_per_step``; each rank
            takes its share); None = one step per rollout batch.
        micro_batch_rows: rows per forward/backward; gradients accumulate over a mini-batch.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        adam_betas: AdamW betas.
        warmup_steps: linear warm-up of the learning rate, in optimizer steps; constant afterwards.
        max_grad_norm: gradient-norm clip (None = off).
        temperature: sampling temperature, also applied to the training logits.
        lora: optional LoRA settings (PEFT).
        gradient_checkpointing: trade compute for memory in the policy's forward.
        logprob_chunk_rows: rows per forward when computing log-probs without grad.
        importance_correction: train/inference mismatch correction with the engine's sampling log-probs:
            "none", "token" or "sequence" truncated importance sampling.
        importance_cap: cap C of the truncated importance weights.
        skip_zero_advantage: skip the forward/backward of rows whose advantage is 0 (the loss's divisor is
            kept, so the update is identical).
        val_pass_at_k: the k values of pass@k logged in validation (each <= the validation sample count).
        save_pretrained_dir: if set, the policy (LoRA merged) and tokenizer are saved there at the end of fit,
            and logged as the MLflow run's ``policy/`` artifacts (reload: ``lit_fgrpo.reporting.load_policy_from_run``).
        seed: seed for building a model from ``model_config``.
        max_nonfinite_skips: optimizer steps with a non-finite loss or gradient are skipped (counted, logged as
            ``train/nonfinite_skips``); this many in a row stop the run with a ``NonFiniteError``.
    """

    def __init__(
        self,
        model: str | None = None,
        model_config: dict[str, Any] | None = None,
        tokenizer: str | None = None,
        gamma: float = 0.5,
        loss_type: LossType = "grpo",
        epsilon: float | None = None,
        epsilon_high: float | None = None,
        beta: float = 0.0,
        scale_rewards: AdvantageScale = "group",
        advantage_eps: float = 1e-6,
        num_iterations: int = 1,
        mini_batch_prompts: int | None = None,
        micro_batch_rows: int = 64,
        lr: float = 1e-6,
        weight_decay: float = 0.0,
        adam_betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 0,
        max_grad_norm: float | None = 1.0,
        temperature: float = 1.0,
        lora: LoraSettings | None = None,
        gradient_checkpointing: bool = False,
        logprob_chunk_rows: int = 64,
        importance_correction: Literal["none", "token", "sequence"] = "none",
        importance_cap: float = 3.0,
        skip_zero_advantage: bool = True,
        val_pass_at_k: list[int] | None = None,
        save_pretrained_dir: str | None = None,
        seed: int = 0,
        group_weight: GroupWeight | None = None,
        max_nonfinite_skips: int = 5,
    ) -> None:
        super().__init__()
        if isinstance(group_weight, dict):  # as stored in a checkpoint's hyperparameters
            group_weight = GroupWeight(**group_weight)
        check_module_args(locals())
        self.nonfinite_guard = NonFiniteGuard(max_nonfinite_skips)
        self.save_hyperparameters()
        # Stored as a plain dict: Lightning resumes with torch.load(weights_only=True), which refuses other classes.
        self.hparams["group_weight"] = dataclasses.asdict(group_weight) if group_weight is not None else None
        self.automatic_optimization = False
        self.loss_type: LossType = loss_type
        self.epsilon, self.epsilon_high = clip_range(loss_type, epsilon, epsilon_high)
        self.tokenizer = load_tokenizer(tokenizer or model or "")
        self.is_lora = lora is not None
        # The reference lives outside the module tree: never in checkpoints, never in the optimizer.
        self._reference: list[nn.Module] = []
        self.pass_at_k = PassAtK(sorted(set(val_pass_at_k or [1])))
        self.timer = PhaseTimer()
        """Wall time per phase of the current training batch, logged under ``time/`` in ``on_train_batch_end``.

        The module times old_logprobs, ref_logprobs, forward, backward, optimizer and log; the rollout callback
        times generate, reward and sync into the same timer (and an asynchronous rollout source adds ``wait``:
        ``module.timer.add("wait", seconds)`` or ``with module.timer.phase("wait"): ...``)."""

    # ------------------------------------------------------------------ model
    @override
    def configure_model(self) -> None:
        """Build the policy (seeded, the same on every rank), LoRA, gradient checkpointing and the reference.

        Idempotent, as Lightning requires. Under a Trainer with ``precision="bf16-true"`` (or ``"16-true"``) the
        weights are built in that dtype; otherwise in float32.
        """
        if "policy" in self._modules:
            return
        hp = self.hp
        dtype = torch.float32
        if self._trainer is not None:
            dtype = _HALF_PRECISIONS.get(str(self.trainer.precision), torch.float32)
        policy = build_policy(hp.model, hp.model_config, self.tokenizer, hp.seed, dtype=dtype)
        if hp.gradient_checkpointing:
            # Non-reentrant: works when the inputs need no grad (frozen embeddings, LoRA) and with our decoder call.
            policy.gradient_checkpointing_enable(  # type: ignore[operator]
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        if hp.beta > 0 and not self.is_lora:
            reference = copy.deepcopy(policy).eval()
            reference.requires_grad_(False)
            self._reference.append(reference)
        # Registered as the submodule "policy" (checkpoint keys `policy.*`); `add_module` would trip over the
        # `policy` property, which builds on first use.
        self._modules["policy"] = apply_lora(policy, hp.lora) if hp.lora is not None else policy
        if self._trainer is not None:  # issue 24: FSDP1 refused; FSDP2 (model_parallel) shards policy and reference
            shard_for_strategy(self.trainer.strategy, self.device_mesh, self._modules["policy"], self._reference)

    @property
    def policy(self) -> nn.Module:
        """The trained causal LM (a PEFT wrapper with LoRA); built on first use outside a Trainer."""
        if "policy" not in self._modules:
            self.configure_model()
        module = self._modules["policy"]
        assert module is not None
        return module

    @property
    def hp(self) -> Any:
        """The saved hyperparameters (typed loosely for attribute access); the one source of ``gamma`` & co."""
        return self.hparams

    @property
    def reference(self) -> nn.Module | None:
        """The frozen reference for the KL term (None without KL, and with LoRA: the adapters are disabled)."""
        if self.hp.beta > 0:
            _ = self.policy  # built together
        return self._reference[0] if self._reference else None

    @override
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> PromptBatch:
        """The seam: the data module's ``list[PromptRecord]`` becomes a :class:`PromptBatch` for the callbacks."""
        return as_prompt_batch(batch)

    @override
    def on_fit_start(self) -> None:
        # The reference sits outside the module tree, so the strategy does not move it; follow the policy.
        if self.reference is not None:
            self.reference.to(self.device)

    @override
    def configure_optimizers(self) -> Any:
        params = [p for p in self.policy.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params, lr=self.hp.lr, weight_decay=self.hp.weight_decay, betas=tuple(self.hp.adam_betas)
        )
        warmup = self.hp.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / (warmup + 1)))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ------------------------------------------------------------------ log-probs
    def _logp(
        self, model: torch.nn.Module, rollout: RolloutBatch, rows: Tensor, with_entropy: bool = False, width: int = 0
    ) -> Any:
        """Log-probs of ``rows``; ``width`` > 0 trims the completion to its first ``width`` columns (and the
        prompt's all-padding leading columns of these rows), which changes no value: (b, width) out."""
        ids, attn = rollout.input_ids[rows], rollout.attention_mask[rows]  # (b, Tp + T)
        T = rollout.completion_length
        if width:
            ids, attn = trim_rows(ids, attn, T, width)  # (b, Tp' + width)
            T = width
        return completion_logprobs(
            model,
            ids,
            attn,
            T,
            temperature=self.hp.temperature,
            chunk_rows=max(1, len(rows)) if torch.is_grad_enabled() else self.hp.logprob_chunk_rows,
            with_entropy=with_entropy,
        )

    @torch.no_grad()
    def _old_logp(self, rollout: RolloutBatch) -> Tensor:
        """(B, T) log-probs of the policy before this step's updates (eval mode: no dropout)."""
        rows = torch.arange(rollout.input_ids.shape[0], device=self.device)
        with self.timer.phase("old_logprobs"), eval_mode(self.policy):
            return self._logp(self.policy, rollout, rows).logp

    @torch.no_grad()
    def _ref_logp(self, rollout: RolloutBatch) -> Tensor:
        """(B, T) log-probs of the frozen reference (for LoRA: the policy with its adapters disabled)."""
        rows = torch.arange(rollout.input_ids.shape[0], device=self.device)
        with self.timer.phase("ref_logprobs"):
            if self.is_lora:
                with self.policy.disable_adapter(), eval_mode(self.policy):  # type: ignore[operator]
                    return self._logp(self.policy, rollout, rows).logp
            assert self.reference is not None
            return self._logp(self.reference, rollout, rows).logp

    # ------------------------------------------------------------------ training
    @override
    def training_step(self, batch: PromptBatch, batch_idx: int) -> Tensor:
        """One RL step on the rollout that the rollout callback attached to ``batch``."""
        return self.step_on(batch.take_rollout())

    def step_on(self, rollout: RolloutBatch) -> Tensor:
        """Train on one rollout: advantages, ``num_iterations`` passes of mini-batch optimizer steps, logging.

        Needs the Trainer's optimizer (call it from ``training_step``); :meth:`backward_on` is the
        Trainer-free piece. Returns the summed loss of all optimizer steps.
        """
        rollout = rollout.to(self.device)
        P, G = rollout.num_prompts, rollout.group_size
        advantages = self.advantages(rollout)  # (P, G)
        flat_adv = advantages.reshape(-1)  # (B,)
        mask = rollout.completion_mask  # (B, T)
        world = self.trainer.world_size
        prompts_per_step = per_rank_mini_batch(self.hp.mini_batch_prompts, world) or P
        num_minibatches = math.ceil(P / prompts_per_step)
        # In one pass with one optimizer step the live log-probs are the old ones: no extra forward (the
        # importance weights, row-local, are then computed per micro-batch from the live log-probs).
        needs_old = self.hp.num_iterations > 1 or num_minibatches > 1
        train_old = self._old_logp(rollout) if needs_old else None  # (B, T)
        ref_logp = self._ref_logp(rollout) if self.hp.beta > 0 else None  # (B, T)
        is_weights = None
        if self.hp.importance_correction != "none" and rollout.sampling_logp is not None and train_old is not None:
            is_weights = truncated_importance_weights(
                train_old, rollout.sampling_logp, mask, self.hp.importance_correction, self.hp.importance_cap
            )  # (B, T) or (B, 1)
        global_tokens = mask.sum()
        if world > 1:
            global_tokens = self.trainer.strategy.reduce(global_tokens, reduce_op="sum")
        num_items = token_divisor(global_tokens, world, num_minibatches)

        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        assert isinstance(optimizer, LightningOptimizer)
        assert isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler)
        pieces: list[dict[str, Tensor]] = []
        trained_before = self.timer.total(("forward", "backward", "optimizer"))
        for iteration in range(self.hp.num_iterations):
            for first_prompt in range(0, P, prompts_per_step):
                rows = torch.arange(first_prompt * G, min(P, first_prompt + prompts_per_step) * G, device=self.device)
                with self.timer.phase("optimizer"):
                    optimizer.zero_grad(set_to_none=True)
                step_pieces = self._accumulate(
                    rollout, rows, flat_adv, train_old, ref_logp, is_weights, num_items, entropy=iteration == 0
                )
                pieces.extend(step_pieces)
                step_loss = torch.stack([p["loss"] for p in step_pieces]).sum() if step_pieces else None
                with self.timer.phase("optimizer"):
                    # Checked before clipping: a NaN norm would spread to every gradient and hide the culprit's name.
                    # Under DDP the gradients are all-reduced, so a non-finite loss on one rank makes every rank skip
                    # (and, after max_nonfinite_skips in a row, stop) together: no rank waits in a collective.
                    if not self.nonfinite_guard.check(self.global_step, step_loss, self.policy.named_parameters()):
                        optimizer.zero_grad(
                            set_to_none=True
                        )  # no step, no scheduler step: the weights stay as they were
                        continue
                    if self.hp.max_grad_norm is not None:
                        self.clip_gradients(optimizer.optimizer, gradient_clip_val=self.hp.max_grad_norm)
                    optimizer.step()
                    scheduler.step()
        elapsed = self.timer.total(("forward", "backward", "optimizer")) - trained_before
        num_steps = self.hp.num_iterations * num_minibatches
        trained_tokens = sum(float(p["tokens"]) for p in pieces)
        self.timer.add_tokens("train", trained_tokens, phases=("forward", "backward"))
        with self.timer.phase("log"):
            values = train_stats(pieces, num_steps, trained_tokens / max(elapsed, 1e-9))
            values["train/nonfinite_skips"] = float(self.nonfinite_guard.num_skipped)
            values |= global_rollout_stats(rollout, advantages, self.applied_group_weight)  # over all ranks
            values |= mismatch_stat(pieces, train_old, rollout.sampling_logp, mask)
            self.log_dict(values, on_step=True, on_epoch=False, batch_size=P)
            self.log("reward", values["rollout/reward_mean"], prog_bar=True, logger=False, batch_size=P)
        return torch.stack([p["loss"] for p in pieces]).sum() if pieces else torch.zeros((), device=self.device)

    @property
    def applied_group_weight(self) -> GroupWeight:
        """The per-group weight the advantages are multiplied by: ``group_weight``, else focal with ``gamma``."""
        weight = self.hp.get("group_weight")
        return GroupWeight(**weight) if weight is not None else GroupWeight("focal", gamma=float(self.hp.gamma))

    def advantages(self, rollout: RolloutBatch) -> Tensor:
        """(P, G) group advantages of a rollout, weighted by :attr:`applied_group_weight`."""
        return group_advantages(
            rollout.rewards,
            0.0,
            self.hp.scale_rewards,
            rollout.correct,
            self.hp.advantage_eps,
            group_weight=self.applied_group_weight,
        ).to(self.device)

    def backward_on(self, rollout: RolloutBatch) -> list[dict[str, Tensor]]:
        """Forward/backward of a whole rollout as one mini-batch (one pass, one step), without an optimizer step.

        Gradients accumulate in the policy's ``.grad``; usable outside a Trainer (tests, a user's own loop).
        Returns the loss pieces of the micro-batches (see :func:`~lit_fgrpo.objectives.diagnostics.train_stats`).
        """
        rollout = rollout.to(self.device)
        flat_adv = self.advantages(rollout).reshape(-1)  # (B,)
        ref_logp = self._ref_logp(rollout) if self.hp.beta > 0 else None  # (B, T)
        rows = torch.arange(rollout.input_ids.shape[0], device=self.device)
        num_items = token_divisor(rollout.completion_mask.sum(), 1, 1)
        return self._accumulate(rollout, rows, flat_adv, None, ref_logp, None, num_items)

    def _accumulate(
        self,
        rollout: RolloutBatch,
        rows: Tensor,
        flat_adv: Tensor,
        train_old: Tensor | None,
        ref_logp: Tensor | None,
        is_weights: Tensor | None,
        num_items: Tensor,
        entropy: bool = True,
    ) -> list[dict[str, Tensor]]:
        """Forward/backward over micro-batches of one mini-batch; the losses add up to the mini-batch loss.

        The micro-batches come from :func:`lit_fgrpo.micro_batches.plan_micro_batches` (zero-advantage rows left
        out, rows sorted by length, each piece cut to its longest completion: the gradient is unchanged). The
        policy runs in train mode here (gradient checkpointing and dropout apply) and in eval mode everywhere else.
        ``entropy`` computes the logged entropy (the first pass only; ``train/entropy`` averages the pieces that
        have it).
        """
        mask = rollout.completion_mask  # (B, T)
        mb_rows, mb_tokens = len(rows), mask[rows].sum()
        T = rollout.completion_length
        lengths = rollout.attention_mask[:, -T:].sum(dim=1)  # (B,) completion tokens present
        skip_zero = self.hp.skip_zero_advantage and self.hp.beta == 0
        plan = plan_micro_batches(rows, flat_adv, lengths, self.hp.micro_batch_rows, skip_zero)
        # DDP all-reduces gradients in every backward: every rank runs as many as the busiest one.
        if self._trainer is not None and self.trainer.world_size > 1:
            plan += padding_micro_batches(rows, global_max(len(plan)) - len(plan))
        one_pass_weights = train_old is None and self.hp.importance_correction != "none"
        pieces: list[dict[str, Tensor]] = []
        for micro in plan:
            chunk, width = micro.rows, micro.width
            share_of = 0.0 if micro.padding else 1.0
            cols = slice(0, width)
            m = mask[chunk][:, cols]  # (b, w)
            sampling_logp = rollout.sampling_logp[chunk][:, cols] if rollout.sampling_logp is not None else None
            with self.timer.phase("forward"), train_mode(self.policy):
                out = self._logp(self.policy, rollout, chunk, with_entropy=entropy, width=width)  # (b, w)
                weights = is_weights[chunk][:, cols] if is_weights is not None else None  # (b, w) or (b, 1)
                if one_pass_weights and sampling_logp is not None:
                    weights = truncated_importance_weights(
                        out.logp.detach(), sampling_logp, m, self.hp.importance_correction, self.hp.importance_cap
                    )
                agg = piece_aggregation(self.loss_type, len(chunk), mb_rows, mb_tokens, num_items)
                share = agg.share * share_of
                loss, piece = policy_loss(
                    out.logp,
                    train_old[chunk][:, cols] if train_old is not None else None,
                    flat_adv[chunk],
                    m,
                    agg.loss_type,
                    self.epsilon,
                    self.epsilon_high,
                    ref_logp[chunk][:, cols] if ref_logp is not None else None,
                    self.hp.beta,
                    max_completion_length=rollout.max_completion_length,
                    num_items=agg.num_items,
                    importance_weights=weights,
                )
            with self.timer.phase("backward"), train_mode(self.policy):
                if self._trainer is not None:
                    self.manual_backward(loss * share)
                else:  # used outside a Trainer (backward_on from a user's own loop or a test)
                    (loss * share).backward()
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

    @override
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # After the callbacks' on_train_batch_end (the weight sync): every phase of this batch lands on its step.
        values = self.timer.summary()
        if values:
            self.log_dict(values, on_step=True, on_epoch=False, batch_size=1)

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["nonfinite_guard"] = self.nonfinite_guard.state_dict()

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.nonfinite_guard.load_state_dict(checkpoint.get("nonfinite_guard", {}))

    # ------------------------------------------------------------------ validation
    @override
    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        rollout = batch.take_rollout()
        self.pass_at_k.update(rollout.correct)
        reward = float(torch.nanmean(rollout.rewards))
        self.log("val/reward_mean", reward, batch_size=rollout.num_prompts, sync_dist=True)

    def _log_pass_at_k(self, split: str) -> None:
        """Log ``{split}/pass_at_k`` accumulated over the epoch and reset (nothing when no problem was seen)."""
        if float(self.pass_at_k.num_problems) == 0:
            return
        values = self.pass_at_k.compute()
        assert isinstance(values, dict)  # built with a list of k
        for name, value in values.items():
            self.log(f"{split}/{name}", value.float(), prog_bar=split == "val" and name == "pass_at_1")
        self.pass_at_k.reset()

    @override
    def on_validation_epoch_end(self) -> None:
        self._log_pass_at_k("val")

    @override
    def test_step(self, batch: PromptBatch, batch_idx: int) -> None:
        self.pass_at_k.update(batch.take_rollout().correct)

    @override
    def on_test_epoch_end(self) -> None:
        self._log_pass_at_k("test")

    # ------------------------------------------------------------------ export
    @override
    def on_fit_end(self) -> None:
        # After the callbacks' on_fit_end (Lightning's order), before the logger closes the run.
        if self.hp.save_pretrained_dir and is_sharded(self.policy):  # issue 24: every rank gathers, rank 0 writes
            self.save_pretrained(self.hp.save_pretrained_dir)
        elif self.hp.save_pretrained_dir and self.trainer.is_global_zero:
            directory = self.save_pretrained(self.hp.save_pretrained_dir)
            # The run carries the weights it produced: the same files as the run's `policy/` artifacts.
            where = log_policy(self.logger, directory)
            rank_zero_info(f"policy saved to {directory}" + (f" and logged as {where}" if where else ""))

    def save_pretrained(self, directory: str | Path) -> Path:
        """Save the policy (LoRA merged into a copy) and the tokenizer, loadable by transformers unchanged.

        A sharded (FSDP2) policy is gathered one tensor at a time: every rank must call this; rank 0 writes."""
        if is_sharded(self.policy):  # issue 24
            return save_sharded_policy(self.policy, self.tokenizer, directory, write=self.global_rank == 0)
        return save_policy(self.policy, self.tokenizer, directory, merge_lora=self.is_lora)
