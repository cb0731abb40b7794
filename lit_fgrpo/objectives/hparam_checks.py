"""Checks on the module's settings that the type system cannot express (ranges, finiteness, exclusive pairs).

:func:`check_module_args` is called by ``FGRPOModule.__init__`` with the constructor's arguments; each failure is a
:class:`lit_fgrpo.errors.ConfigError` naming the flag, so the CLI prints it as one ``error:`` line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.objectives.loss_types import loss_spec

FLOAT_SETTINGS = (
    "gamma",
    "epsilon",
    "epsilon_high",
    "beta",
    "advantage_eps",
    "lr",
    "weight_decay",
    "max_grad_norm",
    "temperature",
    "importance_cap",
)
"""Float settings of ``FGRPOModule`` that must be finite when set (NaN compares false with every bound)."""


def check_module_numbers(args: Mapping[str, Any]) -> None:
    """Refuse non-finite floats, ``epsilon`` outside [0, 1] (``1 - epsilon`` is the lower clip bound, so above 1 it
    is negative), a negative ``epsilon_high`` and Adam betas outside [0, 1).

    Args:
        args: The module's constructor arguments by name; absent or ``None`` settings are skipped.

    Raises:
        ConfigError: ``"--model.<name> ..."`` for the first bad setting.
    """
    for name in FLOAT_SETTINGS:
        value = args.get(name)
        if value is not None and not math.isfinite(float(value)):
            raise ConfigError(f"--model.{name} must be finite, got {value}")
    epsilon, epsilon_high = args.get("epsilon"), args.get("epsilon_high")
    if epsilon is not None and not 0 <= epsilon <= 1:
        raise ConfigError(
            f"--model.epsilon must be in [0, 1], got {epsilon} (the ratio's lower clip bound 1 - epsilon would be "
            "negative)"
        )
    if epsilon_high is not None and epsilon_high < 0:
        raise ConfigError(f"--model.epsilon_high must be >= 0, got {epsilon_high}")
    if epsilon is not None and epsilon_high is not None and epsilon_high < epsilon:
        raise ConfigError(
            f"--model.epsilon_high={epsilon_high} is below --model.epsilon={epsilon}: the clip range's upper side "
            "1 + epsilon_high would be narrower than its lower one (the asymmetric clip widens the upper side)"
        )
    betas = args.get("adam_betas")
    if betas is not None:
        if len(betas) != 2:
            raise ConfigError(f"--model.adam_betas must be two numbers, got {list(betas)}")
        for i, beta in enumerate(betas):
            if not (math.isfinite(float(beta)) and 0 <= beta < 1):
                raise ConfigError(f"--model.adam_betas[{i}] must be in [0, 1), got {beta}")


def check_module_args(args: Mapping[str, Any]) -> None:
    """All checks of ``FGRPOModule``'s constructor arguments: :func:`check_module_numbers`, then ``gamma`` and
    ``group_weight`` (exclusive: the group weight replaces the focal one), then the ranges and the choice of loss.

    Args:
        args: The module's constructor arguments by name (``group_weight`` already a ``GroupWeight`` or None).

    Raises:
        ConfigError: ``"--model.<name> ..."`` for the first bad setting.
    """
    check_module_numbers(args)  # finite floats, epsilon in [0, 1], betas in [0, 1)
    if args["group_weight"] is not None and args["gamma"] != 0:
        raise ConfigError(
            f"--model.gamma={args['gamma']} and --model.group_weight (kind {args['group_weight'].kind!r}) are both "
            "set; the group weight replaces the focal one",
            hint="set --model.gamma 0 to use --model.group_weight, or drop group_weight for F-GRPO",
        )
    loss_spec(args["loss_type"])  # the loss-type table's own one-line refusal, naming --model.loss_type
    mbp = args["mini_batch_prompts"]
    checks = [
        (args["gamma"] >= 0, f"--model.gamma must be >= 0, got {args['gamma']}"),
        (args["beta"] >= 0, f"--model.beta must be >= 0, got {args['beta']}"),
        (args["num_iterations"] >= 1, f"--model.num_iterations must be >= 1, got {args['num_iterations']}"),
        (args["micro_batch_rows"] >= 1, f"--model.micro_batch_rows must be >= 1, got {args['micro_batch_rows']}"),
        (args["lr"] > 0, f"--model.lr must be > 0, got {args['lr']}"),
        (args["temperature"] > 0, f"--model.temperature must be > 0, got {args['temperature']}"),
        (args["advantage_eps"] > 0, f"--model.advantage_eps must be > 0, got {args['advantage_eps']}"),
        (args["warmup_steps"] >= 0, f"--model.warmup_steps must be >= 0, got {args['warmup_steps']}"),
        (args["importance_cap"] > 0, f"--model.importance_cap must be > 0, got {args['importance_cap']}"),
        (mbp is None or mbp >= 1, f"--model.mini_batch_prompts must be >= 1, got {mbp}"),
    ]
    checks += [(k >= 1, f"--model.val_pass_at_k values must be >= 1, got {k}") for k in args["val_pass_at_k"] or []]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
