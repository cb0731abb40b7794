"""Golden weights: the maze_tiny pipeline (tiny model, HF engine, warm start, maze reward) after k RL steps.

The fixture was first recorded before the rollout-seam redesign (issue 8, commit 42cdcf6) and proved that the
redesign changed no number. It was re-recorded once for an intended change, per-prompt sampling seeds (issue 9:
``prompt_seed(seed, position, step, stream)`` and per-row Gumbel-max sampling in the HF engine change which tokens
are drawn), after checking that the rest of that change (global mini-batches, padded backwards, fail-together
checks, reduced statistics) still matched the old fixture under the old sampling. It was re-recorded a second
time for the HF engine's counter-based row sampler (issue 15: one uniform number per row and step from
SplitMix64 and inverse-CDF sampling instead of a ``torch.Generator`` per row, which draws other tokens from the
same distribution); that change touched nothing but the sampler. It was re-recorded a third time for the shared-prompt forward of the
training pass (issue 15: each distinct prompt runs through the decoder once, its KV cache indexed out to the
group's rows): with that one piece switched off, the new code reproduced the previous fixture bit for bit (the
engine's own sampling loop drew the same tokens as ``generate``; logits kept instead of recomputed change no
float), and with it on the weights moved by at most 4.1e-6, float rounding of the summed prompt gradients. It runs on 1 torch thread, as every test does
(``tests/conftest.py``), so the fixture does not depend on which tests ran before it in the same process. It now pins the numbers of everything after it. Re-record only for an intended behaviour change:
``LIT_FGRPO_RECORD_GOLDEN=1 .venv/bin/python -m pytest tests/training/test_golden.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from safetensors.torch import load_file, save_file

from lit_fgrpo.callbacks import WarmStartCallback
from lit_fgrpo.module import FGRPOModule
from lit_fgrpo.rollout.base import SamplingConfig
from tests.training.tiny_setup import MAZE_TINY_MODEL, maze_data, quiet_trainer, word_count_rollouts

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "golden_maze_tiny_3_steps.safetensors"
STEPS = 3
WARM_STEPS = 150  # enough supervised steps that some groups of 8 have mixed rewards in the 3 RL steps


class ActiveGroups(L.Callback):
    """Records ``rollout/frac_active_groups`` of every step: the reward must move the weights."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.values.append(float(trainer.callback_metrics["rollout/frac_active_groups"]))


def run_maze_tiny(steps: int = STEPS) -> tuple[dict[str, torch.Tensor], list[float]]:
    L.seed_everything(0)
    data = maze_data(maze_rows=4, maze_cols=4, num_train=300, num_val=8, num_test=8, val_size=8, seed=0)
    module = FGRPOModule(
        model_config=MAZE_TINY_MODEL,
        tokenizer="builtin:maze",
        gamma=0.5,
        loss_type="grpo",
        lr=1e-3,
        max_grad_norm=1.0,
        micro_batch_rows=128,
        val_pass_at_k=[1, 8],
    )
    rollout = word_count_rollouts(
        sampling=SamplingConfig(n=8, max_tokens=16, stop_token_ids=[7]), val_samples=8, reward_funcs=["maze"]
    )
    active = ActiveGroups()
    trainer = quiet_trainer(
        steps,
        [WarmStartCallback(steps=WARM_STEPS, batch_size=64, lr=1e-3), rollout, active],
        enable_checkpointing=False,
        devices=1,
    )
    trainer.fit(module, data)
    return {name: p.detach().clone().contiguous() for name, p in module.policy.state_dict().items()}, active.values


def test_weights_after_k_steps_match_the_recorded_fixture() -> None:
    weights, active = run_maze_tiny()
    assert len(active) == STEPS and max(active) > 0, f"no group had mixed rewards {active}: nothing would move"
    if os.environ.get("LIT_FGRPO_RECORD_GOLDEN") == "1":
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        save_file(weights, str(FIXTURE))
    golden = load_file(str(FIXTURE))
    assert set(golden) == set(weights)
    for name, value in golden.items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=1e-6, msg=name)
