"""``FGRPOModule``: the policy, the frozen reference and the Lightning glue of the focal-weighted update.

``training_step`` hands the rollout that :class:`~lit_fgrpo.callbacks.RolloutCallback` attached to the batch to the
Trainer-free :class:`~lit_fgrpo.update.PolicyUpdate` and logs what it returns. The policy (and the reference, LoRA,
gradient checkpointing) is built in :meth:`configure_model`, under the strategy's init contexts (bf16 weights with
``precision="bf16-true"``); outside a Trainer the first access to :attr:`policy` builds it.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from typing_extensions import override

from lit_fgrpo.distributed.full_copy import save_sharded_policy
from lit_fgrpo.distributed.strategy import shard_for_strategy
from lit_fgrpo.distributed.weight_gather import is_sharded
from lit_fgrpo.lora import lora_settings
from lit_fgrpo.metrics import PassAtK
from lit_fgrpo.objectives import AdvantageScale, GroupWeight, LossType
from lit_fgrpo.objectives.aggregation import clip_range
from lit_fgrpo.objectives.hparam_checks import check_module_args
from lit_fgrpo.objectives.nonfinite import NonFiniteGuard
from lit_fgrpo.pass_at_k_steps import PassAtKSteps
from lit_fgrpo.policy import LoraSettings, apply_lora, build_policy, load_tokenizer, save_policy
from lit_fgrpo.reporting.artifacts import log_policy
from lit_fgrpo.rollout.batch import PromptBatch, RolloutBatch, as_prompt_batch
from lit_fgrpo.timing import PhaseTimer
from lit_fgrpo.update import ImportanceCorrection, PolicyUpdate, UpdateSettings
from lit_fgrpo.update_handles import LightningCollectives, LightningOptimizerStep

# The batch seam overrides on_after_batch_transfer on purpose while PromptDataModule (which does not) serves the
# data; Lightning warns about every module hook of that kind. This one is by design.
warnings.filterwarnings("ignore", message=r".*`on_after_batch_transfer` in `LightningModule`.*")

_HALF_PRECISIONS = {"bf16-true": torch.bfloat16, "16-true": torch.float16}


class FGRPOModule(PassAtKSteps):
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
        importance_correction: ImportanceCorrection = "none",
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
        lora = lora_settings(lora)  # a mapping from YAML, LightningCLI's hparams or a checkpoint; checked
        check_module_args(locals())
        self.nonfinite_guard = NonFiniteGuard(max_nonfinite_skips)
        self.save_hyperparameters()
        # Stored as a plain dict: Lightning resumes with torch.load(weights_only=True), which refuses other classes.
        self.hparams["group_weight"] = dataclasses.asdict(group_weight) if group_weight is not None else None
        self.hparams["lora"] = dataclasses.asdict(lora) if lora is not None else None
        self.lora = lora  # checked settings; None: the full policy is trained
        self.automatic_optimization = False
        self.loss_type: LossType = loss_type
        self.epsilon, self.epsilon_high = clip_range(loss_type, epsilon, epsilon_high)
        weight = group_weight if group_weight is not None else GroupWeight("focal", gamma=float(gamma))
        self.update_settings = UpdateSettings(
            loss_type=loss_type, epsilon=self.epsilon, epsilon_high=self.epsilon_high, beta=beta, group_weight=weight,
            scale_rewards=scale_rewards, advantage_eps=advantage_eps, importance_correction=importance_correction,
            importance_cap=importance_cap, num_iterations=num_iterations, mini_batch_prompts=mini_batch_prompts,
            micro_batch_rows=micro_batch_rows, logprob_chunk_rows=logprob_chunk_rows, temperature=temperature,
            skip_zero_advantage=skip_zero_advantage, max_grad_norm=max_grad_norm,
        )  # fmt: skip
        """The objective and batching settings of :meth:`policy_update`."""
        self.tokenizer = load_tokenizer(tokenizer or model or "")
        # The reference lives outside the module tree: never in checkpoints, never in the optimizer.
        self._reference: list[nn.Module] = []
        self.pass_at_k = PassAtK(sorted(set(val_pass_at_k or [1])))
        self.timer = PhaseTimer()
        """Wall time per phase of the training batch (the update's and the rollout callback's), logged under ``time/``."""

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
        self._modules["policy"] = apply_lora(policy, self.lora) if self.lora is not None else policy
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
    def is_lora(self) -> bool:
        """Whether the policy trains LoRA adapters (``lora`` is set) rather than all its weights."""
        return self.lora is not None

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
        params, hp = [p for p in self.policy.parameters() if p.requires_grad], self.hp
        optimizer = torch.optim.AdamW(params, lr=hp.lr, weight_decay=hp.weight_decay, betas=tuple(hp.adam_betas))
        warmup = hp.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / (warmup + 1)))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ------------------------------------------------------------------ what the callbacks read (RolloutConsumer)
    @property
    def pass_at_k_ks(self) -> list[int]:
        """The k values of pass@k logged in validation and test (``val_pass_at_k``), ascending."""
        return list(self.pass_at_k.ks)

    @property
    def temperature(self) -> float:
        """The sampling temperature the module trains with (its training logits are divided by it)."""
        return float(self.update_settings.temperature)

    @property
    def importance_correction(self) -> ImportanceCorrection:
        """The train/inference mismatch correction: ``"none"``, ``"token"`` or ``"sequence"``."""
        return self.update_settings.importance_correction

    @property
    def group_weight(self) -> GroupWeight:
        """The per-group weight the advantages are multiplied by: ``group_weight``, else focal with ``gamma``."""
        return self.update_settings.group_weight

    applied_group_weight = group_weight
    """Alias of :attr:`group_weight` (its earlier name)."""

    # ------------------------------------------------------------------ training
    def policy_update(self) -> PolicyUpdate:
        """The Trainer-free update over this module's policy, reference, settings, timer and non-finite guard."""
        return PolicyUpdate(
            self.policy, self.reference, self.update_settings, self.timer, self.nonfinite_guard, self.device
        )

    @override
    def training_step(self, batch: PromptBatch, batch_idx: int) -> Tensor:
        """One RL step on the rollout that the rollout callback attached to ``batch``: update, then log."""
        collectives = LightningCollectives(self._trainer)
        result = self.policy_update().step(batch.take_rollout(), LightningOptimizerStep(self), collectives)
        with self.timer.phase("log"):
            self.log_dict(result.metrics, on_step=True, on_epoch=False, batch_size=result.num_prompts)
            reward = result.metrics["rollout/reward_mean"]
            self.log("reward", reward, prog_bar=True, logger=False, batch_size=result.num_prompts)
        return result.loss

    def advantages(self, rollout: RolloutBatch) -> Tensor:
        """(P, G) group advantages of a rollout, weighted by :attr:`group_weight`."""
        return self.policy_update().advantages(rollout)

    def backward_on(self, rollout: RolloutBatch) -> list[dict[str, Tensor]]:
        """Forward/backward of a whole rollout as one mini-batch, no optimizer step (also outside a Trainer).

        Gradients accumulate in ``.grad``; returns the micro-batches' statistics (:meth:`PolicyUpdate.backward_on`).
        """
        backward = self.manual_backward if self._trainer is not None else Tensor.backward
        return self.policy_update().backward_on(rollout, backward, LightningCollectives(self._trainer))

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
