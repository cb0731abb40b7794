"""Range checks on the module's numeric settings that the type system cannot express.

:func:`check_module_numbers` is called by ``FGRPOModule._validate`` with the constructor's arguments; each failure is
a :class:`lit_fgrpo.errors.ConfigError` naming the flag, so the CLI prints it as one ``error:`` line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from lit_fgrpo.errors import ConfigError

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
    betas = args.get("adam_betas")
    if betas is not None:
        if len(betas) != 2:
            raise ConfigError(f"--model.adam_betas must be two numbers, got {list(betas)}")
        for i, beta in enumerate(betas):
            if not (math.isfinite(float(beta)) and 0 <= beta < 1):
                raise ConfigError(f"--model.adam_betas[{i}] must be in [0, 1), got {beta}")
