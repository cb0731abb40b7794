"""One sweep arm: a wall-clock deadline stops it after a step with a checkpoint, and the next call resumes there."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_fgrpo.experiments.sweep_arm import Arm, checkpoint_step, train_arm
from lit_fgrpo.module import FGRPOModule
from tests.training.tiny_setup import MAZE_TINY_MODEL as TINY_MODEL

DATA = dict(source="maze", maze_rows=2, maze_cols=3, num_train=64, num_val=4, num_test=4, prompts_per_step=2,
            val_batch_size=4, seed=0, val_size=4, tokenizer_path="builtin:maze")  # fmt: skip
MODULE = dict(model_config=TINY_MODEL, tokenizer="builtin:maze", lr=1e-3, val_pass_at_k=[1], seed=0)


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
