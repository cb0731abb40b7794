"""The policy's optional LoRA adapters: their settings, checked where they are read, and the PEFT wrapper.

``--model.policy.lora`` arrives as a :class:`LoraSettings` from the CLI's parser, but as a plain mapping from the
places that store it as data: LightningCLI's saved hyperparameters, a checkpoint's ``hparams``, a YAML mapping given
to the Python API. :func:`lora_settings` turns either into :class:`LoraSettings`, which checks itself on
construction, so a wrong value is one line naming ``--model.policy.lora.<field>``, never an ``AttributeError`` when
the policy is built.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.settings_mapping import settings_from

FLAG = "--model.policy.lora"
"""How the CLI names these settings."""


def _number(name: str, value: Any, integer: bool) -> float:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(f"{FLAG}.{name}: expected {'int' if integer else 'float'}, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{FLAG}.{name} must be finite, got {value}")
    return value


@dataclass
class LoraSettings:
    """PEFT LoRA settings for the policy (the reference model is the base with adapters disabled)."""

    r: int = 16
    """LoRA rank (>= 1)."""
    alpha: int = 32
    """LoRA scaling numerator (lora_alpha, > 0)."""
    dropout: float = 0.0
    """Dropout on the LoRA branch, in [0, 1)."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names that receive adapters (at least one)."""

    def __post_init__(self) -> None:
        """Refuse a rank below 1, a non-positive alpha, a dropout outside [0, 1) and an empty or blank target list.

        Raises:
            ConfigError: ``"--model.policy.lora.r must be >= 1, got 0"`` and the like.
        """
        if _number("r", self.r, integer=True) < 1:
            raise ConfigError(f"{FLAG}.r must be >= 1, got {self.r}")
        if _number("alpha", self.alpha, integer=False) <= 0:
            raise ConfigError(f"{FLAG}.alpha must be > 0, got {self.alpha}")
        if not 0 <= _number("dropout", self.dropout, integer=False) < 1:
            raise ConfigError(f"{FLAG}.dropout must be in [0, 1), got {self.dropout}")
        modules = self.target_modules
        if isinstance(modules, str) or not isinstance(modules, list | tuple):
            raise ConfigError(f"{FLAG}.target_modules: expected a list of module names, got {modules!r}")
        if not modules:
            raise ConfigError(
                f"{FLAG}.target_modules is empty: LoRA needs at least one module to adapt",
                hint="e.g. target_modules: [q_proj, k_proj, v_proj, o_proj]",
            )
        for index, name in enumerate(modules):
            if not isinstance(name, str) or not name.strip():
                raise ConfigError(f"{FLAG}.target_modules[{index}] must be a module name, got {name!r}")
        self.target_modules = list(modules)


def lora_settings(value: LoraSettings | Mapping[str, Any] | None) -> LoraSettings | None:
    """``value`` (settings, a mapping of their fields, or ``None`` for no LoRA) as checked :class:`LoraSettings`.

    Raises:
        ConfigError: For a field that does not exist, a value of the wrong type or out of range, naming
            ``--model.policy.lora.<field>``.
    """
    return None if value is None else settings_from(LoraSettings, value, FLAG)


def apply_lora(policy: nn.Module, lora: LoraSettings) -> nn.Module:
    """Wrap ``policy`` with PEFT LoRA adapters; only adapter weights stay trainable.

    Raises:
        ConfigError: When none of ``lora.target_modules`` is a module of ``policy``, naming the setting.
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(policy, config)  # type: ignore[arg-type]
    except ValueError as err:
        if "not found in the base model" not in str(err):
            raise
        raise ConfigError(
            f"{FLAG}.target_modules {list(lora.target_modules)} names no module of the policy",
            hint="use the names of its linear layers, e.g. q_proj, k_proj, v_proj, o_proj",
        ) from err
