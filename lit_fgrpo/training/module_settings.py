"""``FGRPOModule``'s settings groups, each typed, documented and checked once, and the migration of flat ones.

``FGRPOModule(policy=PolicySettings(...), objective=ObjectiveSettings(...), optimizer=..., batching=...)``; on the
command line ``--model.objective.gamma 1.0``, in YAML ``model: {objective: {gamma: 1.0}}``. Each group refuses a
wrong value on construction with one :class:`~lit_fgrpo.errors.ConfigError` naming the full flag.

Checkpoints written before the groups existed store the thirty settings flat (``{"gamma": 0.5, "lr": 1e-6, ...}``);
:func:`grouped_settings` maps them onto the groups, and :func:`checkpoint_init_args` reads them from a checkpoint
for ``FGRPOModule.load_from_checkpoint``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.models.lora import LoraSettings, lora_settings
from lit_fgrpo.objectives.objective_settings import ObjectiveSettings
from lit_fgrpo.settings_mapping import flat_checkpoint_init_args, group_flat_settings
from lit_fgrpo.training.optimizer import AdamWKernel, check_kernel


def check_skip_limit(value: float) -> int:
    """``value`` as the int limit of non-finite skips in a row (the rule of the non-finite guard).

    Raises:
        ConfigError: ``--model.optimizer.max_nonfinite_skips must be an integer >= 1, got 0`` (and for 1.5).
    """
    if int(value) != value or value < 1:
        raise ConfigError(f"--model.optimizer.max_nonfinite_skips must be an integer >= 1, got {value}")
    return int(value)


def _finite(flag: str, names: tuple[str, ...], settings: Any) -> None:
    for name in names:
        value = getattr(settings, name)
        if value is not None and not math.isfinite(float(value)):
            raise ConfigError(f"{flag}.{name} must be finite, got {value}")


@dataclass(frozen=True)
class PolicySettings:
    """Where the policy comes from and how it is built, trained (LoRA, checkpointing) and exported."""

    model: str | None = None
    """Local directory of a Hugging Face causal LM (give this or ``model_config``)."""
    model_config: dict[str, Any] | None = None
    """An HF config as a dict (``{"model_type": "qwen2", "hidden_size": 128, ...}``) to build a fresh model from;
    vocab size and special ids default to the tokenizer's."""
    tokenizer: str | None = None
    """Tokenizer directory (defaults to ``model``), or ``builtin:maze``."""
    lora: LoraSettings | None = None
    """Optional LoRA settings (PEFT); None trains every weight."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the policy's forward."""
    seed: int = 0
    """Seed for building a model from ``model_config``."""
    save_pretrained_dir: str | None = None
    """If set, the policy (LoRA merged) and tokenizer are saved there at the end of fit, and logged as the MLflow
    run's ``policy/`` artifacts (reload: ``lit_fgrpo.reporting.load_policy_from_run``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora", lora_settings(self.lora))  # a mapping from YAML or a checkpoint, checked


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW, its warm-up, the gradient clip and the non-finite step guard."""

    lr: float = 1e-6
    """AdamW learning rate (> 0)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas, each in [0, 1)."""
    warmup_steps: int = 0
    """Linear warm-up of the learning rate, in optimizer steps; constant afterwards."""
    max_grad_norm: float | None = 1.0
    """Gradient-norm clip (None = off)."""
    max_nonfinite_skips: int = 5
    """Optimizer steps with a non-finite loss or gradient are skipped (counted, logged as ``train/nonfinite_skips``);
    this many in a row stop the run with a ``NonFiniteError``."""
    kernel: AdamWKernel = "auto"
    """torch's AdamW kernel: ``fused`` (one kernel over every parameter; on the CPU about 6x faster than
    ``foreach`` for a 135M model), ``foreach`` (torch's default), ``for_loop``, or ``auto`` = fused wherever torch
    has it for every trainable parameter (plain tensors on the CPU or CUDA), torch's own choice otherwise."""

    def __post_init__(self) -> None:
        flag = "--model.optimizer"
        _finite(flag, ("lr", "weight_decay", "max_grad_norm"), self)
        if self.lr <= 0:
            raise ConfigError(f"{flag}.lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise ConfigError(f"{flag}.warmup_steps must be >= 0, got {self.warmup_steps}")
        betas = tuple(self.adam_betas)
        if len(betas) != 2:
            raise ConfigError(f"{flag}.adam_betas must be two numbers, got {list(betas)}")
        for i, beta in enumerate(betas):
            if not (math.isfinite(float(beta)) and 0 <= beta < 1):
                raise ConfigError(f"{flag}.adam_betas[{i}] must be in [0, 1), got {beta}")
        object.__setattr__(self, "adam_betas", betas)  # a YAML list as the tuple AdamW takes
        check_skip_limit(self.max_nonfinite_skips)
        check_kernel(self.kernel, f"{flag}.kernel")


@dataclass(frozen=True)
class BatchingSettings:
    """How a rollout is cut into optimizer steps and forward passes (the update is the same for any cut)."""

    num_iterations: int = 1
    """Passes over each rollout batch (mu); > 1 stores old log-probs."""
    mini_batch_prompts: int | None = None
    """Prompts per optimizer step over all ranks (global, like ``--data.loader.prompts_per_step``; each rank takes
    its share); None = one step per rollout batch."""
    micro_batch_rows: int = 64
    """Rows per forward/backward; gradients accumulate over a mini-batch."""
    micro_batch_tokens: int | None = None
    """At most this many padded tokens per forward/backward as well: rows x (the longest prompt + the longest
    completion among them), rows sorted by completion length (verl's ``ppo_max_token_len_per_gpu``). Bounds the
    activations of long multi-turn rows without shrinking the micro-batches of short ones; the update is the same.
    A row longer than the budget goes alone. None = ``micro_batch_rows`` only."""
    logprob_chunk_rows: int = 64
    """Rows per forward when computing log-probs without grad."""
    skip_zero_advantage: bool = True
    """Skip the forward/backward of rows whose advantage is 0 (the loss's divisor is kept, so the update is
    identical)."""

    def __post_init__(self) -> None:
        flag, mbp = "--model.batching", self.mini_batch_prompts
        for name in ("num_iterations", "micro_batch_rows", "logprob_chunk_rows"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag}.{name} must be >= 1, got {getattr(self, name)}")
        if mbp is not None and mbp < 1:
            raise ConfigError(f"{flag}.mini_batch_prompts must be >= 1, got {mbp}")
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 1:
            raise ConfigError(f"{flag}.micro_batch_tokens must be >= 1 or null, got {self.micro_batch_tokens}")


GROUPS: dict[str, type] = {
    "policy": PolicySettings,
    "objective": ObjectiveSettings,
    "optimizer": OptimizerSettings,
    "batching": BatchingSettings,
}
"""``FGRPOModule``'s settings groups by init argument name."""
FLAT_NAMES: dict[str, str] = {f.name: group for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}
"""The group of each setting that checkpoints written before the groups stored flat (``"lr": "optimizer"``)."""


def grouped_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """Settings given flat (an old checkpoint's ``hyper_parameters``), grouped, as ``FGRPOModule`` takes them.

    ``{"gamma": 1.0, "lr": 1e-3, "val_pass_at_k": [1]}`` -> ``{"objective": {"gamma": 1.0}, "optimizer":
    {"lr": 1e-3}, "val_pass_at_k": [1]}``. Groups given as mappings are kept (and flat names merged into them),
    as is ``val_pass_at_k``; LightningCLI's ``_instantiator`` and ``_class_path`` are dropped.

    Raises:
        ConfigError: For a flat name that is no setting of any group.
    """
    flat = {name: (group, name) for name, group in FLAT_NAMES.items()}  # the fields kept their names
    return group_flat_settings(values, GROUPS, flat, ("val_pass_at_k",), "--model", "FGRPOModule")


def checkpoint_init_args(checkpoint_path: str | Path | IO[bytes]) -> dict[str, Any]:
    """The grouped init arguments of a checkpoint with flat hyperparameters (``{}`` for a grouped one);
    :func:`~lit_fgrpo.settings_mapping.flat_checkpoint_init_args` with the module's names."""
    return flat_checkpoint_init_args(checkpoint_path, "hyper_parameters", FLAT_NAMES, grouped_settings)


__all__ = [
    "FLAT_NAMES",
    "GROUPS",
    "BatchingSettings",
    "ObjectiveSettings",
    "OptimizerSettings",
    "PolicySettings",
    "checkpoint_init_args",
    "grouped_settings",
]
