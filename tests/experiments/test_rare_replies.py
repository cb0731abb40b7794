"""``lit-fgrpo rare-nll`` on the real model: the base's correct replies, their NLL, and ΔNLL_rare of saved runs."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from lit_fgrpo.experiments.compare_runs import RESULTS, CompareSettings, run_dir
from lit_fgrpo.experiments.rare_replies import measure, rare_part, sample_pool, training_questions
from lit_fgrpo.theory.dnll_rare import delta_nll_rare, rare_indices, sequence_nll

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "models" / "SmolLM2-135M-Instruct"


def compare_settings(tmp: Path) -> CompareSettings:
    return CompareSettings(
        fit_configs=[str(ROOT / "configs" / "smollm2" / "arith.yaml")], arms={"GRPO": [], "F-GRPO": []},
        baseline="GRPO", seeds=[1], out_dir=str(tmp),
    )  # fmt: skip


def test_the_questions_are_the_fit_configs_training_split(tmp_path: Path) -> None:
    from lit_fgrpo.tasks.arithmetic import ArithmeticSettings
    from lit_fgrpo.tasks.builtin import arithmetic_prompts

    questions, answers = training_questions(compare_settings(tmp_path))
    splits = arithmetic_prompts(ArithmeticSettings(min_value=1, max_value=20), 272, 128, 0, 0)
    assert questions == [p.question for p in splits["train"]] and len(set(questions)) == 272
    held_out = {p.question for p in splits["val"]}
    assert not held_out & set(questions)
    assert all(eval(q.removeprefix("What is ").split("?")[0]) == int(a) for q, a in zip(questions, answers))  # noqa: S307


@pytest.mark.vllm
def test_pool_nll_and_delta_on_the_real_model(tmp_path: Path) -> None:
    if not (FOLDER / "config.json").is_file():
        pytest.skip(f"{FOLDER} not imported (bash scripts/setup.sh imports it)")
    from transformers import AutoModelForCausalLM

    questions = ["What is 1 + 1? Reply with just the number.", "What is 2 + 3? Reply with just the number."]
    pool = sample_pool(str(FOLDER), questions, ["2", "5"], samples=16, max_tokens=16)
    assert pool.num_sampled == 32 and len(pool) > 0
    # every kept reply's NLL against a forward of that reply alone, without the pool's padding
    model = AutoModelForCausalLM.from_pretrained(FOLDER, torch_dtype=torch.float32).eval()
    for row in range(len(pool)):
        width = int(pool.attention_mask[row].sum())
        alone = sequence_nll(model, pool.input_ids[row : row + 1, :width], pool.attention_mask[row : row + 1, :width],
                             pool.completion_mask[row : row + 1, :width])  # fmt: skip
        torch.testing.assert_close(alone[0], pool.base_nll[row], rtol=1e-4, atol=1e-4)
    # a run whose saved policy is the base model itself has moved nothing; an unfinished run is left out
    settings = compare_settings(tmp_path)
    for arm in settings.arms:
        folder = run_dir(settings, 1, arm)
        folder.mkdir(parents=True)
        os.symlink(FOLDER, folder / "policy")
    (run_dir(settings, 1, "GRPO") / RESULTS).write_text(json.dumps({"before": {}, "after": {}}))
    result = measure(settings, pool, top_fraction=0.5)
    assert result["runs"]["GRPO"]["1"]["dnll_rare"] == pytest.approx(0.0, abs=1e-5)
    assert result["runs"]["F-GRPO"] == {} and result["pool"]["correct"] == len(pool)
    # the rare part: the half of the replies with the highest base NLL, as delta_nll_rare ranks them
    rare = rare_part(pool, 0.5)
    assert result["pool"]["rare"] == len(rare) == math.ceil(len(pool) / 2)
    assert float(rare.base_nll.min()) >= float(pool.base_nll.sort(descending=True).values[len(rare) - 1]) - 1e-6
    shifted = pool.base_nll + torch.arange(len(pool)) / 100  # a "trained" NLL: row i moved by i / 100
    rows = rare_indices(pool.base_nll, 0.5)
    assert delta_nll_rare(pool.base_nll, shifted, 0.5) == pytest.approx(
        float((shifted[rows] - pool.base_nll[rows]).mean())
    )
