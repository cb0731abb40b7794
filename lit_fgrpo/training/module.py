"""``FGRPOModule``: the policy, the frozen reference and the Lightning glue of the focal-weighted update.

``training_step`` hands the rollout that :class:`~lit_fgrpo.callbacks.RolloutCallback` attached to the batch to the
Trainer-free :class:`~lit_fgrpo.training.update.PolicyUpdate` and logs what it returns. The policy (and the reference, LoRA,
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
from typing_extensions import Self, override

from lit_fgrpo.distributed.strategy import shard_for_strategy
from lit_fgrpo.distributed.weight_gather import is_sharded
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.metrics import PassAtK
from lit_fgrpo.models.lora import LoraSettings
from lit_fgrpo.models.policy import apply_lora, build_policy, save_policy, save_sharded_policy
from lit_fgrpo.objectives import GroupWeight, LossType
from lit_fgrpo.reporting.artifacts import log_policy
from lit_fgrpo.reporting.timing import PhaseTimer
from lit_fgrpo.rollout.batch import PromptBatch, RolloutBatch, as_prompt_batch
from lit_fgrpo.settings_mapping import settings_from
from lit_fgrpo.tasks.registry import load_tokenizer
from lit_fgrpo.training.module_settings import (
    GROUPS,
    BatchingSettings,
    ObjectiveSettings,
    OptimizerSettings,
    PolicySettings,
    checkpoint_init_args,
)
from lit_fgrpo.training.optimizer import build_adamw, kernel_flags, use_configured_kernel
from lit_fgrpo.training.pass_at_k_steps import PassAtKSteps, held_out_metrics
from lit_fgrpo.training.update import ImportanceCorrection, PolicyUpdate, UpdateSettings
from lit_fgrpo.training.update_handles import LightningCollectives, LightningOptimizerStep, NonFiniteGuard

# The batch seam overrides on_after_batch_transfer on purpose while PromptDataModule (which does not) serves the
# data; Lightning warns about every module hook of that kind. This one is by design.
warnings.filterwarnings("ignore", message=r".*`on_after_batch_transfer` in `LightningModule`.*")

_HALF_PRECISIONS = {"bf16-true": torch.bfloat16, "16-true": torch.float16}


class FGRPOModule(PassAtKSteps):
    """F-GRPO / F-DAPO / F-CISPO training of a causal LM on verifiable rewards.

    Args:
        policy: the model, tokenizer, LoRA, gradient checkpointing, build seed and export folder
            (``--model.policy.*``; :class:`~lit_fgrpo.training.module_settings.PolicySettings`).
        objective: loss type and clips, gamma or another group weight, KL, advantage scale, temperature, importance
            correction (``--model.objective.*``; :class:`~lit_fgrpo.objectives.objective_settings.ObjectiveSettings`).
        optimizer: AdamW, warm-up, gradient clip, non-finite skips (``--model.optimizer.*``;
            :class:`~lit_fgrpo.training.module_settings.OptimizerSettings`).
        batching: mu passes, mini-batches, micro-batches, log-prob chunks, zero-advantage skipping
            (``--model.batching.*``; :class:`~lit_fgrpo.training.module_settings.BatchingSettings`).
        val_pass_at_k: the k values of pass@k logged in validation (each <= the validation sample count).

    Each group may also be given as a mapping of its fields (as checkpoints store them).
    """

    def __init__(
        self,
        policy: PolicySettings = PolicySettings(),
        objective: ObjectiveSettings = ObjectiveSettings(),
        optimizer: OptimizerSettings = OptimizerSettings(),
        batching: BatchingSettings = BatchingSettings(),
        val_pass_at_k: list[int] | None = None,
    ) -> None:
        super().__init__()
        self.policy_settings = settings_from(PolicySettings, policy, "--model.policy")
        """Where the policy comes from and how it is built (``--model.policy.*``)."""
        self.objective = settings_from(ObjectiveSettings, objective, "--model.objective")
        """What the update optimises (``--model.objective.*``)."""
        self.optimizer_settings = settings_from(OptimizerSettings, optimizer, "--model.optimizer")
        """AdamW, warm-up, clip and the non-finite guard's limit (``--model.optimizer.*``)."""
        self.batching = settings_from(BatchingSettings, batching, "--model.batching")
        """How a rollout is cut into optimizer steps and forward passes (``--model.batching.*``)."""
        for k in val_pass_at_k or []:
            if k < 1:
                raise ConfigError(f"--model.val_pass_at_k values must be >= 1, got {k}")
        self.save_hyperparameters()
        # Plain dicts: Lightning resumes with torch.load(weights_only=True), which refuses other classes, and a
        # logger's log_hyperparams cannot convert a frozen dataclass. Saved again so that hparams_initial (what
        # loggers log) holds the dicts too.
        groups: tuple[Any, ...] = (self.policy_settings, self.objective, self.optimizer_settings, self.batching)
        self.save_hyperparameters(
            dict(self.hparams) | {name: dataclasses.asdict(group) for name, group in zip(GROUPS, groups)}
        )
        self.nonfinite_guard = NonFiniteGuard(self.optimizer_settings.max_nonfinite_skips)
        self.automatic_optimization = False
        self.update_settings = UpdateSettings.of(self.objective, self.batching, self.optimizer_settings)
        """The objective and batching settings of :meth:`policy_update`, resolved."""
        self.tokenizer = load_tokenizer(self.policy_settings.tokenizer or self.policy_settings.model or "")
        # The reference lives outside the module tree: never in checkpoints, never in the optimizer.
        self._reference: list[nn.Module] = []
        self.held_out = held_out_metrics(sorted(set(val_pass_at_k or [1])))
        """pass@k for each k, the reward mean and the first-turn share of a held-out epoch (:class:`PassAtKSteps`)."""
        self.timer = PhaseTimer()
        """Wall time per phase of the training batch (the update's and the rollout callback's), logged under ``time/``."""
        self._fit_update: tuple[PolicyUpdate, LightningOptimizerStep, LightningCollectives] | None = None

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Self:  # type: ignore[override]
        """Lightning's loader; a checkpoint with the flat settings of before the groups is migrated first."""
        kwargs = checkpoint_init_args(checkpoint_path) | kwargs
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)  # type: ignore[no-any-return]

    @override
    def setup(self, stage: str) -> None:
        # Lightning 2.6.6 builds a torch ``LeafSpec`` for every dataloader it wraps (CombinedLoader ->
        # lightning/pytorch/utilities/_pytree.py, line 21), and torch 2.13 deprecates that class with a FutureWarning
        # on each construction: library code calling library code, in every fit and validate, with no call of ours
        # to change. Set here (before Lightning wraps the loaders) rather than on import, so that it also holds
        # under filters set after the import (pytest's per-test ones, a user's ``-W``).
        warnings.filterwarnings(
            "ignore",
            message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
            category=FutureWarning,
            module=r"lightning\.pytorch\.utilities\._pytree",
        )

    # ------------------------------------------------------------------ model
    @override
    def configure_model(self) -> None:
        """Build the policy (seeded, the same on every rank), LoRA, gradient checkpointing and the reference.

        Idempotent, as Lightning requires. Under a Trainer with ``precision="bf16-true"`` (or ``"16-true"``) the
        weights are built in that dtype; otherwise in float32.
        """
        if "policy" in self._modules:
            return
        settings = self.policy_settings
        dtype = torch.float32
        if self._trainer is not None:
            dtype = _HALF_PRECISIONS.get(str(self.trainer.precision), torch.float32)
        policy = build_policy(settings.model, settings.model_config, self.tokenizer, settings.seed, dtype=dtype)
        if settings.gradient_checkpointing:
            # Non-reentrant: works when the inputs need no grad (frozen embeddings, LoRA) and with our decoder call.
            policy.gradient_checkpointing_enable(  # type: ignore[operator]
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        if self.objective.beta > 0 and not self.is_lora:
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
    def loss_type(self) -> LossType:
        """The loss type (``--model.objective.loss_type``)."""
        return self.objective.loss_type

    @property
    def epsilon(self) -> float:
        """The lower clip, the loss type's default where none was given."""
        return self.objective.clip[0]

    @property
    def epsilon_high(self) -> float:
        """The upper clip, the loss type's default where none was given."""
        return self.objective.clip[1]

    @property
    def lora(self) -> LoraSettings | None:
        """The checked LoRA settings (``--model.policy.lora``); None: the full policy is trained."""
        return self.policy_settings.lora

    @property
    def is_lora(self) -> bool:
        """Whether the policy trains LoRA adapters (``lora`` is set) rather than all its weights."""
        return self.lora is not None

    @property
    def reference(self) -> nn.Module | None:
        """The frozen reference for the KL term (None without KL, and with LoRA: the adapters are disabled)."""
        if self.objective.beta > 0:
            _ = self.policy  # built together
        return self._reference[0] if self._reference else None

    @override
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> PromptBatch:
        """The seam: the data module's ``list[PromptRecord]`` becomes a :class:`PromptBatch` for the callbacks."""
        return as_prompt_batch(batch)

    @override
    def on_train_start(self) -> None:
        # after Lightning restored a checkpoint's optimizer state, whose param groups carry the kernel it ran with
        o = self.optimizer_settings
        for optimizer in self.trainer.optimizers:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            use_configured_kernel(optimizer, kernel_flags(params, o.kernel))
        # The fit's update and its handles, once: policy, reference, device and optimizer are fixed from here on.
        self._fit_update = (self.policy_update(), LightningOptimizerStep(self), LightningCollectives(self.trainer))

    @override
    def on_train_end(self) -> None:
        self._fit_update = None

    @override
    def on_fit_start(self) -> None:
        # The reference sits outside the module tree, so the strategy does not move it; follow the policy.
        if self.reference is not None:
            self.reference.to(self.device)

    @override
    def configure_optimizers(self) -> Any:
        params, o = [p for p in self.policy.parameters() if p.requires_grad], self.optimizer_settings
        optimizer = build_adamw(params, o.lr, o.weight_decay, o.adam_betas, o.kernel)
        warmup = o.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / (warmup + 1)))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ------------------------------------------------------------------ what the callbacks read (RolloutConsumer)
    @property
    def pass_at_k_ks(self) -> list[int]:
        """The k values of pass@k logged in validation and test (``val_pass_at_k``), ascending."""
        means = [m for m in self.held_out.values() if isinstance(m, PassAtK) and m.statistic == "mean"]
        return [metric.ks[0] for metric in means]

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
        assert self._fit_update is not None, "on_train_start builds the fit's update"
        update, optimizer, collectives = self._fit_update
        result = update.step(batch.take_rollout(), optimizer, collectives)
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
        folder = self.policy_settings.save_pretrained_dir
        if folder and is_sharded(self.policy):  # issue 24: every rank gathers, rank 0 writes
            self.save_pretrained(folder)
        elif folder and self.trainer.is_global_zero:
            directory = self.save_pretrained(folder)
            # The run carries the weights it produced: the same files as the run's `policy/` artifacts.
            where = log_policy(self.logger, directory)
            rank_zero_info(f"policy saved to {directory}" + (f" and logged as {where}" if where else ""))

    def save_pretrained(self, directory: str | Path) -> Path:
        """Save the policy (LoRA merged into a copy) and the tokenizer, loadable by transformers unchanged.

        A sharded (FSDP2) policy is gathered one tensor at a time: every rank must call this; rank 0 writes."""
        if is_sharded(self.policy):  # issue 24
            return save_sharded_policy(self.policy, self.tokenizer, directory, write=self.global_rank == 0)
        return save_policy(self.policy, self.tokenizer, directory, merge_lora=self.is_lora)
