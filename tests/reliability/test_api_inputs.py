"""Group 6: API inputs: non-finite floats, non-boolean verdicts and out-of-range values are refused by name."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.metrics import PassAtK, pass_at_k
from lit_fgrpo.objectives.advantages import focal_weight, group_advantages
from lit_fgrpo.training.module_settings import GROUPS, grouped_settings

REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0]])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gamma": math.nan}, "group_advantages: gamma must be finite and >= 0, got nan"),
        ({"gamma": math.inf}, "group_advantages: gamma must be finite and >= 0, got inf"),
        ({"gamma": -0.5}, "group_advantages: gamma must be finite and >= 0, got -0.5"),
        ({"eps": math.nan}, "group_advantages: eps must be finite and > 0, got nan"),
        (
            {"success": torch.tensor([[0.9, 0.1, 0.0, 1.0]])},
            "group_advantages: success must be boolean (or 0/1 integers), got dtype torch.float32",
        ),
        (
            {"success": torch.tensor([[2, 0, 0, 1]])},
            "group_advantages: success must be boolean (or 0/1 integers), got 2",
        ),
    ],
    ids=["gamma_nan", "gamma_inf", "gamma_negative", "eps_nan", "success_float", "success_int_2"],
)
def test_group_advantages_refuses(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        group_advantages(REWARDS, **kwargs)
    assert str(info.value) == message


def test_inf_reward_refused_by_group_advantages() -> None:
    with pytest.raises(
        ValueError, match=r"rewards must be finite or NaN \(unscorable\), got inf at \(p, g\) = \(0, 2\)"
    ):
        group_advantages(torch.tensor([[1.0, 0.0, math.inf]]), gamma=0.5)


def test_success_as_0_1_integers_matches_bool() -> None:
    as_int = group_advantages(REWARDS, gamma=1.0, success=torch.tensor([[1, 0, 0, 1]]))
    as_bool = group_advantages(REWARDS, gamma=1.0, success=torch.tensor([[True, False, False, True]]))
    assert torch.equal(as_int, as_bool)


def test_focal_weight_gamma_nan() -> None:
    with pytest.raises(ConfigError, match=r"^focal_weight: gamma must be finite and >= 0, got nan$"):
        focal_weight(torch.tensor([0.5]), math.nan)


def test_pass_at_k_refuses_probabilities() -> None:
    metric = PassAtK([1, 2])
    with pytest.raises(ValueError) as info:
        metric.update(torch.tensor([[0.9, 0.8], [0.1, 0.7]]))
    assert str(info.value) == "PassAtK.update: correct must be boolean (or 0/1 integers), got dtype torch.float32"
    with pytest.raises(ValueError, match=r"got 3$"):
        metric.update(torch.tensor([[3, 0]]))
    metric.update(torch.tensor([[1, 0], [0, 0]]))  # 0/1 integers are verdicts
    result = metric.compute()
    assert isinstance(result, dict)
    assert {k: round(float(v), 3) for k, v in result.items()} == {"pass_at_1": 0.25, "pass_at_2": 0.5}


def test_pass_at_k_refuses_fractional_counts() -> None:
    with pytest.raises(ValueError, match="num_correct must be whole counts"):
        pass_at_k(torch.tensor([4.0]), torch.tensor([0.5]), 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            {"epsilon": 1.5},
            "--model.objective.epsilon must be in [0, 1], got 1.5 (the ratio's lower clip bound 1 - epsilon would be negative)",
        ),
        (
            {"epsilon": -0.1},
            "--model.objective.epsilon must be in [0, 1], got -0.1 (the ratio's lower clip bound 1 - epsilon would be negative)",
        ),
        ({"epsilon_high": -1.0}, "--model.objective.epsilon_high must be >= 0, got -1.0"),
        ({"adam_betas": (0.9, 1.0)}, "--model.optimizer.adam_betas[1] must be in [0, 1), got 1.0"),
        ({"adam_betas": (-0.1, 0.9)}, "--model.optimizer.adam_betas[0] must be in [0, 1), got -0.1"),
        ({"adam_betas": (0.9,)}, "--model.optimizer.adam_betas must be two numbers, got [0.9]"),
        ({"lr": math.nan}, "--model.optimizer.lr must be finite, got nan"),
        ({"temperature": math.inf}, "--model.objective.temperature must be finite, got inf"),
        ({"gamma": math.nan}, "--model.objective.gamma must be finite and >= 0, got nan"),
        ({"max_grad_norm": math.nan}, "--model.optimizer.max_grad_norm must be finite, got nan"),
    ],
    ids=[
        "eps_above_1",
        "eps_negative",
        "eps_high_negative",
        "beta2_1",
        "beta1_negative",
        "betas_len",
        "lr_nan",
        "temp_inf",
        "gamma_nan",
        "clip_nan",
    ],
)
def test_module_numbers_refused_by_flag(args: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings_groups(args)
    assert str(info.value) == message


def test_module_numbers_accept_the_presets() -> None:
    settings_groups({"epsilon": 1.0, "epsilon_high": 5.0, "adam_betas": (0.9, 0.999), "gamma": 0.5, "lr": 1e-6})
    settings_groups({"epsilon": None, "epsilon_high": None, "max_grad_norm": None})


def settings_groups(flat: dict[str, Any]) -> dict[str, Any]:
    """The module's settings groups built (and so checked) from settings named flat."""
    return {name: GROUPS[name](**fields) for name, fields in grouped_settings(flat).items()}
