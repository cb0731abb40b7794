"""``FGRPOModule``: the policy, the frozen reference and the focal-weighted optimizer steps.

The module is glue: advantages come from :func:`lit_fgrpo.objectives.group_advantages`, the loss from
:func:`lit_fgrpo.objectives.policy_loss`. Rollouts are produced by
:class:`lit_fgrpo.callbacks.RolloutCallback`, which hands each batch over with :meth:`FGRPOModule.receive_rollout`
before ``training_step`` / ``validation_step`` run. All G samples of a prompt stay on one rank, so group
statistics need no gather.
"""

from __future__ import annotations

import copy
import math
import random
import time
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from torch import Tensor

from lit_fgrpo.logprobs import completion_logprobs
from lit_fgrpo.metrics import PassAtK
from lit_fgrpo.objectives import AdvantageScale, LossType, focal_weight, group_advantages, group_success_rate
from lit_fgrpo.objectives.hparam_checks import check_module_numbers
from lit_fgrpo.objectives.mismatch import logprob_mismatch, truncated_importance_weights
from lit_fgrpo.objectives.policy_loss import LOSS_TYPES, policy_loss
from lit_fgrpo.policy import LoraSettings, apply_lora, build_policy, load_tokenizer
from lit_fgrpo.rollout.batch import RolloutBatch

# Clip defaults per loss preset (paper Table 5): GRPO symmetric 0.2, DAPO clip-higher, CISPO IS weight in [0, 6].
LOSS_PRESETS: dict[str, tuple[float, float]] = {
    "grpo": (0.2, 0.2),
    "bnpo": (0.2, 0.2),
    "dr_grpo": (0.2, 0.2),
    "dapo": (0.2, 0.28),
    "cispo": (1.0, 5.0),
}


class FGRPOModule(L.LightningModule):
    """F-GRPO / F-DAPO / F-CISPO training of a causal LM on verifiable rewards.

    Args:
        model: local directory of a Hugging Face causal LM (give this or ``model_config``).
        model_config: an HF config as a dict (``{"model_type": "qwen2", "hidden_size": 128, ...}``) to build a
            fresh model from; vocab size and special ids default to the tokenizer's.
        tokenizer: tokenizer directory (defaults to ``model``), or ``builtin:maze``.
        gamma: focal exponent; the advantage of each group is scaled by (1 - mu_hat) ** gamma. 0 = base method.
        loss_type: grpo, bnpo, dr_grpo, dapo or cispo (sets the clip defaults and the token aggregation).
        epsilon: lower clip (default by preset: 0.2, cispo 1.0).
        epsilon_high: upper clip (default by preset: 0.2, dapo 0.28, cispo 5.0).
        beta: k3 KL coefficient; > 0 keeps a frozen reference (for LoRA: the base with adapters disabled).
        scale_rewards: divide by the group std ("group"), the batch std ("batch") or not at all ("none").
        advantage_eps: added to the std (verl 1e-6, TRL 1e-4).
        num_iterations: passes over each rollout batch (mu); > 1 stores old log-probs.
        mini_batch_prompts: prompts per optimizer step; None = one step per rollout batch.
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
        save_pretrained_dir: if set, the policy (LoRA merged) and tokenizer are saved there at the end of fit.
        seed: seed for building a model from ``model_config``.
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
    ) -> None:
        super().__init__()
        self._validate(locals())
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.gamma = gamma
        self.loss_type: LossType = loss_type
        low, high = LOSS_PRESETS[loss_type]
        self.epsilon = low if epsilon is None else epsilon
        self.epsilon_high = high if epsilon_high is None else epsilon_high
        self.tokenizer = load_tokenizer(tokenizer or model or "")
        policy = build_policy(model, model_config, self.tokenizer, seed)
        if gradient_checkpointing:
            policy.gradient_checkpointing_enable()  # type: ignore[operator]
        self.is_lora = lora is not None
        self.policy = apply_lora(policy, lora) if lora is not None else policy
        # The reference lives outside the module tree: never in checkpoints, never in the optimizer.
        self._reference: list[torch.nn.Module] = []
        if beta > 0 and not self.is_lora:
            reference = copy.deepcopy(policy).eval()
            reference.requires_grad_(False)
            self._reference.append(reference)
        self.val_pass_at_k = PassAtK(sorted(set(val_pass_at_k or [1])))
        self._rollout: RolloutBatch | None = None

    @staticmethod
    def _validate(args: dict[str, Any]) -> None:
        check_module_numbers(args)  # finite floats, epsilon in [0, 1], betas in [0, 1)
        checks = [
            (args["gamma"] >= 0, f"--model.gamma must be >= 0, got {args['gamma']}"),
            (
                args["loss_type"] in LOSS_TYPES,
                f"--model.loss_type must be one of {LOSS_TYPES}, got {args['loss_type']!r}",
            ),
            (args["beta"] >= 0, f"--model.beta must be >= 0, got {args['beta']}"),
            (args["num_iterations"] >= 1, f"--model.num_iterations must be >= 1, got {args['num_iterations']}"),
            (args["micro_batch_rows"] >= 1, f"--model.micro_batch_rows must be >= 1, got {args['micro_batch_rows']}"),
            (args["lr"] > 0, f"--model.lr must be > 0, got {args['lr']}"),
            (args["temperature"] > 0, f"--model.temperature must be > 0, got {args['temperature']}"),
            (args["advantage_eps"] > 0, f"--model.advantage_eps must be > 0, got {args['advantage_eps']}"),
            (args["warmup_steps"] >= 0, f"--model.warmup_steps must be >= 0, got {args['warmup_steps']}"),
            (args["importance_cap"] > 0, f"--model.importance_cap must be > 0, got {args['importance_cap']}"),
        ]
        mbp = args["mini_batch_prompts"]
        checks.append((mbp is None or mbp >= 1, f"--model.mini_batch_prompts must be >= 1, got {mbp}"))
        for k in args["val_pass_at_k"] or []:
            checks.append((k >= 1, f"--model.val_pass_at_k values must be >= 1, got {k}"))
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    # ------------------------------------------------------------------ plumbing
    def receive_rollout(self, rollout: RolloutBatch) -> None:
        """Called by the rollout callback right before ``training_step`` / ``validation_step``."""
        self._rollout = rollout.to(self.device)

    def _take_rollout(self) -> RolloutBatch:
        if self._rollout is None:
            raise RuntimeError(
                "FGRPOModule got a batch without rollouts: add lit_fgrpo.callbacks.RolloutCallback to "
                "Trainer(callbacks=[...]) (or call module.receive_rollout(batch) yourself before each step)."
            )
        rollout, self._rollout = self._rollout, None
        return rollout

    @property
    def hp(self) -> Any:
        """The saved hyperparameters (typed loosely for attribute access)."""
        return self.hparams

    @property
    def reference(self) -> torch.nn.Module | None:
        return self._reference[0] if self._reference else None

    def on_fit_start(self) -> None:
        # The reference sits outside the module tree, so the strategy does not move it; follow the policy.
        if self.reference is not None:
            self.reference.to(self.device)

    def configure_optimizers(self) -> Any:
        params = [p for p in self.policy.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params, lr=self.hp.lr, weight_decay=self.hp.weight_decay, betas=tuple(self.hp.adam_betas)
        )
        warmup = self.hp.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / (warmup + 1)))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ------------------------------------------------------------------ log-probs
    def _logp(self, model: torch.nn.Module, rollout: RolloutBatch, rows: Tensor, with_entropy: bool = False) -> Any:
        return completion_logprobs(
            model,
            rollout.input_ids[rows],
            rollout.attention_mask[rows],
            rollout.completion_length,
            temperature=self.hp.temperature,
            chunk_rows=max(1, len(rows)) if torch.is_grad_enabled() else self.hp.logprob_chunk_rows,
            with_entropy=with_entropy,
        )

    @torch.no_grad()
    def _frozen_logp(self, rollout: RolloutBatch, reference: bool) -> Tensor:
        rows = torch.arange(rollout.input_ids.shape[0], device=self.device)
        if reference and self.is_lora:
            with self.policy.disable_adapter():  # type: ignore[operator]
                return self._logp(self.policy, rollout, rows).logp
        model = self.reference if reference else self.policy
        assert model is not None
        return self._logp(model, rollout, rows).logp

    # ------------------------------------------------------------------ training
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        rollout = self._take_rollout()
        P, G = rollout.num_prompts, rollout.group_size
        advantages = group_advantages(
            rollout.rewards, self.gamma, self.hp.scale_rewards, rollout.correct, self.hp.advantage_eps
        )  # (P, G)
        flat_adv = advantages.reshape(-1).to(self.device)  # (B,)
        mask = rollout.completion_mask  # (B, T)
        prompts_per_step = self.hp.mini_batch_prompts or P
        num_minibatches = math.ceil(P / prompts_per_step)
        needs_old = self.hp.num_iterations > 1 or num_minibatches > 1
        needs_train_logp = needs_old or self.hp.importance_correction != "none"
        train_old = self._frozen_logp(rollout, reference=False) if needs_train_logp else None  # (B, T)
        ref_logp = self._frozen_logp(rollout, reference=True) if self.hp.beta > 0 else None  # (B, T)
        is_weights = None
        if self.hp.importance_correction != "none" and rollout.sampling_logp is not None:
            assert train_old is not None
            is_weights = truncated_importance_weights(
                train_old, rollout.sampling_logp, mask, self.hp.importance_correction, self.hp.importance_cap
            )
        # TRL's dapo/cispo divisor: active tokens of the generation batch (all ranks) / ranks, per optimizer step.
        world = self.trainer.world_size if self._trainer is not None else 1
        global_tokens = mask.sum()
        if world > 1:
            global_tokens = self.trainer.strategy.reduce(global_tokens, reduce_op="sum")
        num_items = global_tokens / world / num_minibatches

        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        step_stats: list[dict[str, Tensor]] = []
        start = time.perf_counter()
        trained_tokens = 0.0
        for _ in range(self.hp.num_iterations):
            for first_prompt in range(0, P, prompts_per_step):
                rows = torch.arange(first_prompt * G, min(P, first_prompt + prompts_per_step) * G, device=self.device)
                optimizer.zero_grad(set_to_none=True)  # type: ignore[union-attr]
                stats, tokens = self._accumulate(rollout, rows, flat_adv, train_old, ref_logp, is_weights, num_items)
                trained_tokens += tokens
                step_stats.extend(stats)
                if self.hp.max_grad_norm is not None:
                    self.clip_gradients(optimizer, gradient_clip_val=self.hp.max_grad_norm)  # type: ignore[arg-type]
                optimizer.step()  # type: ignore[union-attr]
                scheduler.step()  # type: ignore[union-attr]
        elapsed = time.perf_counter() - start
        num_steps = self.hp.num_iterations * num_minibatches
        tokens_per_s = trained_tokens / max(elapsed, 1e-9)
        return self._log_training(rollout, advantages, step_stats, tokens_per_s, train_old, num_steps)

    def _accumulate(
        self,
        rollout: RolloutBatch,
        rows: Tensor,
        flat_adv: Tensor,
        train_old: Tensor | None,
        ref_logp: Tensor | None,
        is_weights: Tensor | None,
        num_items: Tensor,
    ) -> tuple[list[dict[str, Tensor]], float]:
        """Forward/backward over micro-batches of one mini-batch; the losses add up to the mini-batch loss."""
        mask = rollout.completion_mask
        mb_rows, mb_tokens = len(rows), mask[rows].sum()
        if self.hp.skip_zero_advantage and self.hp.beta == 0:
            rows = rows[flat_adv[rows] != 0]
        stats: list[dict[str, Tensor]] = []
        tokens = 0.0
        for chunk in rows.split(self.hp.micro_batch_rows) if len(rows) else ():
            out = self._logp(self.policy, rollout, chunk, with_entropy=True)
            # Aggregate as if the whole mini-batch were one TRL micro-batch: scale each piece by its share.
            loss_type: LossType = self.loss_type
            items: Tensor | None = num_items
            share = 1.0
            if loss_type in ("grpo", "dr_grpo"):
                share = len(chunk) / mb_rows
                items = None
            elif loss_type == "bnpo":
                loss_type, items = "dapo", mb_tokens
            loss, piece = policy_loss(
                out.logp,
                train_old[chunk] if train_old is not None else None,
                flat_adv[chunk],
                mask[chunk],
                loss_type,
                self.epsilon,
                self.epsilon_high,
                ref_logp[chunk] if ref_logp is not None else None,
                self.hp.beta,
                max_completion_length=rollout.max_completion_length,
                num_items=items,
                importance_weights=is_weights[chunk] if is_weights is not None else None,
            )
            if self._trainer is not None:
                self.manual_backward(loss * share)
            else:  # used outside a Trainer (e.g. by a user's own loop or a test)
                (loss * share).backward()
            piece["loss"] = (loss * share).detach()
            piece["tokens"] = mask[chunk].sum()
            assert out.entropy is not None
            piece["entropy_sum"] = (out.entropy * mask[chunk]).sum()
            if train_old is None and rollout.sampling_logp is not None:
                # one pass, one step: the live log-probs are the behaviour policy's, so the mismatch is free
                gap = (out.logp.detach() - rollout.sampling_logp[chunk]).abs()  # (b, T)
                piece["mismatch_sum"] = (gap * mask[chunk]).sum()
            stats.append(piece)
            tokens += float(piece["tokens"])
        return stats, tokens

    def _log_training(
        self,
        rollout: RolloutBatch,
        advantages: Tensor,
        stats: list[dict[str, Tensor]],
        train_tokens_per_s: float,
        train_old: Tensor | None,
        num_steps: int,
    ) -> Tensor:
        rewards, correct = rollout.rewards, rollout.correct
        valid = ~torch.isnan(rewards)
        active = (advantages != 0).any(dim=1)  # (P,)
        mu_hat = group_success_rate(correct, valid)  # (P,)
        weights = focal_weight(mu_hat, self.gamma)  # (P,)
        tokens = sum(float(s["tokens"]) for s in stats)
        loss = torch.stack([s["loss"] for s in stats]).sum() if stats else torch.zeros((), device=self.device)

        def token_mean(key: str) -> float:
            if not stats or tokens == 0:
                return 0.0
            return sum(float(s[key]) * float(s["tokens"]) for s in stats) / tokens

        lengths = rollout.completion_mask.sum(dim=1)
        values = {
            "train/loss": float(loss) / num_steps,
            "train/clip_frac": token_mean("clip_frac"),
            "train/clip_frac_low": token_mean("clip_frac_low"),
            "train/clip_frac_high": token_mean("clip_frac_high"),
            "train/ratio_mean": token_mean("ratio_mean"),
            "train/kl": token_mean("kl"),
            "train/entropy": sum(float(s["entropy_sum"]) for s in stats) / tokens if tokens else 0.0,
            "train/tokens_per_s": train_tokens_per_s,
            "rollout/reward_mean": float(torch.nanmean(rewards)),
            "rollout/reward_std": float(rewards[valid].std()) if valid.sum() > 1 else 0.0,
            "rollout/success_rate": float(mu_hat.mean()),
            "rollout/frac_active_groups": float(active.float().mean()),
            "rollout/completion_length": float(lengths.mean()),
            "focal/weight_mean": float(weights[active].mean()) if active.any() else 1.0,
            "focal/weight_min": float(weights[active].min()) if active.any() else 1.0,
        }
        if train_old is not None and rollout.sampling_logp is not None:
            values["rollout/logprob_mismatch"] = float(
                logprob_mismatch(train_old, rollout.sampling_logp, rollout.completion_mask)
            )
        elif tokens and all("mismatch_sum" in s for s in stats):
            values["rollout/logprob_mismatch"] = sum(float(s["mismatch_sum"]) for s in stats) / tokens
        for key, value in rollout.stats.items():
            values[f"rollout/{key}"] = float(value)
        batch_size = rollout.num_prompts
        self.log_dict(values, on_step=True, on_epoch=False, batch_size=batch_size)
        self.log("reward", values["rollout/reward_mean"], prog_bar=True, logger=False, batch_size=batch_size)
        return loss

    # ------------------------------------------------------------------ validation
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        rollout = self._take_rollout()
        self.val_pass_at_k.update(rollout.correct)
        self.log("val/reward_mean", float(torch.nanmean(rollout.rewards)), batch_size=rollout.num_prompts)

    def _log_pass_at_k(self, split: str) -> dict[str, float]:
        """Log ``{split}/pass_at_k`` accumulated over the epoch and reset; {} when no problem was seen."""
        if float(self.val_pass_at_k.num_problems) == 0:
            return {}
        values = self.val_pass_at_k.compute()
        assert isinstance(values, dict)  # built with a list of k
        for name, value in values.items():
            self.log(f"{split}/{name}", value.float(), prog_bar=split == "val" and name == "pass_at_1")
        self.val_pass_at_k.reset()
        return {name: float(value) for name, value in values.items()}

    def on_validation_epoch_end(self) -> None:
        values = self._log_pass_at_k("val")
        if values:
            self.last_val_pass_at_k = values

    def test_step(self, batch: Any, batch_idx: int) -> None:
        rollout = self._take_rollout()
        self.val_pass_at_k.update(rollout.correct)

    def on_test_epoch_end(self) -> None:
        self._log_pass_at_k("test")

    # ------------------------------------------------------------------ checkpoints and export
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # numpy's state holds an ndarray, which torch.load(weights_only=True) (Lightning's default on resume)
        # refuses to unpickle; store its key array as a tensor so that fit(ckpt_path=...) loads.
        name, keys, pos, has_gauss, cached = np.random.get_state()
        checkpoint["rng_states"] = {
            "torch": torch.get_rng_state(),
            "numpy": (
                str(name),
                torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                int(pos),
                int(has_gauss),
                float(cached),
            ),
            "python": random.getstate(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._pending_rng = checkpoint.get("rng_states")

    def on_train_start(self) -> None:
        states = getattr(self, "_pending_rng", None)
        if states:
            torch.set_rng_state(states["torch"])
            name, keys, pos, has_gauss, cached = states["numpy"]
            keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
            np.random.set_state((name, keys.astype(np.uint32), pos, has_gauss, cached))
            random.setstate(states["python"])
            self._pending_rng = None

    def on_fit_end(self) -> None:
        if self.hp.save_pretrained_dir and self.trainer.is_global_zero:
            self.save_pretrained(self.hp.save_pretrained_dir)

    def save_pretrained(self, directory: str | Path) -> Path:
        """Save the policy (LoRA merged into a copy) and the tokenizer, loadable by transformers unchanged."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        policy = self.policy
        if self.is_lora:
            policy = copy.deepcopy(self.policy).merge_and_unload()  # type: ignore[operator]
        policy.save_pretrained(directory)  # type: ignore[operator]
        self.tokenizer.save_pretrained(directory)
        return directory
