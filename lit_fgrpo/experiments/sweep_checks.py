"""Checks on ``lit-fgrpo maze-sweep``'s settings before anything is written: each bad value is one line naming its flag.

:func:`check_sweep_settings` runs before the output folder is created, so a refused sweep leaves no half-written
``sweep_config.json`` behind that would make the corrected command fail with "differs from the earlier run".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lit_fgrpo.experiments.sweep_arm import Arm
from lit_fgrpo.reporting.mlflow_logging import check_tracking_uri

AT_LEAST_ONE = (
    "prompts_per_step",
    "eval_samples",
    "num_threads",
    "num_train",
    "num_val",
    "num_test",
    "warm_start_batch",
    "micro_batch_rows",
    "val_samples",
    "dnll_prompts",
    "dnll_samples",
    "eval_chunk",
    "ckpt_every",
)
"""Integer settings that count something and must be >= 1."""

POSITIVE_FLOATS = ("warm_start_lr", "rl_lr")
"""Float settings that must be finite and > 0."""

ACCELERATORS = ("cpu", "gpu", "cuda")
"""The ``--accelerator`` values a sweep runs on."""


def check_grid(group_sizes: Sequence[int], gammas: Sequence[float]) -> None:
    """Refuse a group size below 2 or a negative or non-finite gamma of the (N x gamma) grid, naming its flag."""
    if any(n < 2 for n in group_sizes):
        raise ValueError(f"--group_sizes must all be >= 2 (group-relative advantages), got {list(group_sizes)}")
    if any(not math.isfinite(g) or g < 0 for g in gammas):
        raise ValueError(f"--gammas must all be finite and >= 0, got {list(gammas)}")


def check_ranges(s: dict[str, Any]) -> None:
    """Refuse counts below 1, non-positive learning rates and budgets, and other out-of-range values."""
    for name in AT_LEAST_ONE:
        if s[name] < 1:
            raise ValueError(f"--{name} must be >= 1, got {s[name]}")
    for name in POSITIVE_FLOATS:
        if not math.isfinite(s[name]) or s[name] <= 0:
            raise ValueError(f"--{name} must be finite and > 0, got {s[name]}")
    if s["warm_start_steps"] < 0:
        raise ValueError(f"--warm_start_steps must be >= 0, got {s['warm_start_steps']}")
    if not 0 < s["dnll_top_fraction"] <= 1:
        raise ValueError(f"--dnll_top_fraction must be in (0, 1], got {s['dnll_top_fraction']}")
    if s["step_budget"] is not None and s["step_budget"] < 0:  # 0: write the settings, train nothing
        raise ValueError(f"--step_budget must be >= 0 or null, got {s['step_budget']}")
    budget = s["time_budget_s"]
    if budget is not None and not (math.isfinite(budget) and budget >= 0):
        raise ValueError(f"--time_budget_s must be a finite number of seconds >= 0 or null, got {budget}")
    if s["accelerator"] not in ACCELERATORS:
        raise ValueError(f"--accelerator must be one of {', '.join(ACCELERATORS)}, got {s['accelerator']!r}")


def check_sweep_settings(s: dict[str, Any], arms: list[Arm], steps: list[int]) -> None:
    """Reject bad settings of :func:`~lit_fgrpo.experiments.maze_sweep.run_maze_sweep` up front, naming the flag.

    Args:
        s: The sweep's arguments by name.
        arms: The arms to train (parsed ``--arms``, or the grid).
        steps: The sorted milestones and ``rl_steps``.

    Raises:
        ValueError: ``"--<flag> ..."`` (the CLI prints it as one ``error:`` line).
    """
    if not s["arms"]:
        check_grid(s["group_sizes"], s["gammas"])
    check_ranges(s)
    if any(k > s["eval_samples"] for k in s["ks"]):
        raise ValueError(f"--ks: every k in {list(s['ks'])} must be <= --eval_samples={s['eval_samples']}")
    if not arms or not s["seeds"]:
        raise ValueError("--arms (or --group_sizes x --gammas) and --seeds must not be empty")
    if steps[0] < 1:
        raise ValueError(f"--rl_steps and --milestones must be >= 1, got {steps}")
    if any(m > s["rl_steps"] for m in s["milestones"]):
        raise ValueError(f"--milestones {list(s['milestones'])} must not exceed --rl_steps={s['rl_steps']}")
    if s["init_from"] and len(s["seeds"]) > 1:
        raise ValueError("--init_from loads one seed's warm start; give a single --seeds value with it")
    if s["tracking_uri"] is not None and s["tracking_uri"].lower() != "none":
        check_tracking_uri(s["tracking_uri"], "--tracking_uri")
    if s["token_budget"] is not None and (s["token_budget"] < 1 or s["milestones"]):
        raise ValueError(
            f"--token_budget must be >= 1 and used without --milestones, got {s['token_budget']} "
            f"with milestones {list(s['milestones'])}"
        )
