"""One sweep arm: a wall-clock deadline stops it after a step with a checkpoint, and the next call resumes there."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from lit_fgrpo.experiments.sweep_arm import Arm, checkpoint_step, train_arm
from lit_fgrpo.training.module import FGRPOModule
from tests.training.tiny_setup import MAZE_TINY_MODEL as TINY_MODEL

DATA = dict(source="maze", maze={"rows": 2, "cols": 3}, splits={"num_train": 64, "num_val": 4, "num_test": 4,
            "val_size": 4}, loader={"prompts_per_step": 2, "val_batch_size": 4}, seed=0,
            tokenizer_path="builtin:maze")  # fmt: skip
MODULE = dict(
    policy={"model_config": TINY_MODEL, "tokenizer": "builtin:maze", "seed": 0},
    optimizer={"lr": 1e-3},
    val_pass_at_k=[1],
)


def test_deadline_stops_after_one_step_and_resume_continues(tmp_path: Path) -> None:
    base = FGRPOModule(**MODULE).policy.state_dict()
    arm = Arm.parse("2:0.5")
    assert arm.name == "N2_g0.5"
    first = train_arm(tmp_path, arm, base, MODULE, DATA, target_step=3, val_samples=2, seed=0, max_tokens=7,
                      ckpt_every=10, max_seconds=0.0)  # fmt: skip
    assert (
        first.step == first.trained == 1 and checkpoint_step(tmp_path) == 1
    )  # stopped at the deadline, checkpoint written
    second = train_arm(tmp_path, arm, base, MODULE, DATA, target_step=3, val_samples=2, seed=0, max_tokens=7,
                       ckpt_every=10)  # fmt: skip
    assert (second.step, second.trained) == (3, 2) and checkpoint_step(tmp_path) == 3  # resumed, not restarted
    assert second.start_pass_at_k == first.start_pass_at_k  # the pre-RL check survives the resume


@pytest.mark.parametrize("text", ["8", "8:x", "1:0.5", "8:-1"])
def test_bad_arm_is_rejected_naming_the_flag(text: str) -> None:
    with pytest.raises(ValueError, match="--arms"):
        Arm.parse(text)


@pytest.mark.parametrize("text", ["8:0.5:maxrl", "8:0:nope", "8:0:band:x", "8:1:band"])
def test_bad_method_arm_is_rejected_naming_the_flag(text: str) -> None:
    with pytest.raises(ValueError, match="--arms"):
        Arm.parse(text)


def test_method_arms_carry_the_overlay_settings() -> None:
    assert Arm.parse("8:0.5") == Arm(8, 0.5, "focal") and Arm.parse("8:0.5").name == "N8_g0.5"
    maxrl, band, dynamic, gspo = (Arm.parse(f"8:0:{m}") for m in ("maxrl", "band", "dynamic", "gspo"))
    assert (maxrl.name, dynamic.name) == ("N8_g0_maxrl", "N8_g0_dynamic")
    # the same settings as configs/maze/{maxrl,band,gspo,dynamic}.yaml
    maze = Path(__file__).parents[2] / "configs" / "maze"
    for arm in (maxrl, band, gspo, Arm.parse("8:0.5:async")):
        overlay = yaml.safe_load((maze / f"{arm.method}.yaml").read_text())["model"]
        overrides = arm.module_overrides()
        weight = overrides["objective"].pop("group_weight", None)
        objective = {k: v for k, v in overlay["objective"].items() if k not in ("gamma", "group_weight")}
        assert overlay | {"objective": objective} == overrides
        if weight is not None:
            assert dataclasses.asdict(weight) | overlay["objective"]["group_weight"] == dataclasses.asdict(weight)
    rollout = yaml.safe_load((maze / "async.yaml").read_text())["rollout"]
    assert (rollout["engine"], rollout["max_staleness"]) == ("hf_copy", 1)  # as train_arm
    rollout = yaml.safe_load((maze / "dynamic.yaml").read_text())["rollout"]
    assert dataclasses.asdict(dynamic.dynamic_sampling()) | rollout["dynamic_sampling"] == (
        dataclasses.asdict(dynamic.dynamic_sampling())
    )
    assert Arm.parse("8:0").dynamic_sampling() is None and Arm.parse("8:0").module_overrides() == {}


def test_token_budget_ends_the_arm_and_counts_dynamic_draws(tmp_path: Path) -> None:
    base = FGRPOModule(**MODULE).policy.state_dict()
    runs = {}
    for text in ("2:0", "2:0:dynamic"):
        runs[text] = train_arm(tmp_path / text, Arm.parse(text), base, MODULE, DATA, target_step=20, val_samples=2,
                               seed=0, max_tokens=7, ckpt_every=10, token_budget=60)  # fmt: skip
    for run in runs.values():
        assert run.budget_reached and run.generated_tokens >= 60 and run.step < 20
    # dynamic sampling draws at least twice the prompts per step (oversample 2): the budget lasts fewer steps
    assert runs["2:0:dynamic"].step < runs["2:0"].step
