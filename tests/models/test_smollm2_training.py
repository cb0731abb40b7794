"""The real model end to end: SmolLM2-135M-Instruct (grouped-query attention, tied embeddings, a 49k BPE
vocabulary with its chat template) trained for 2 RL steps through ``configs/smollm2/arith.yaml`` with its ``vllm.yaml``
overlay (the colocated vLLM engine), with LoRA (the merged adapter is pushed) and with every weight trained.

Checked: the prompt token ids vLLM receives are the chat template's rendering of each question; every weight push
(before each step and after the last) passes the engine's log-prob check at 1e-3, and the logged gap is far
below it; the policy moved. Skipped without vLLM or without the imported model (``bash scripts/setup.sh``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lit_fgrpo.cli import cli_main
from tests.training.tiny_setup import MemoryLogger

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "smollm2" / "arith.yaml"
VLLM_OVERLAY = ROOT / "configs" / "smollm2" / "vllm.yaml"
FOLDER = ROOT / "models" / "SmolLM2-135M-Instruct"
SYNC_TOLERANCE = 1e-3


def brevity_reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
    """A small length penalty beside the 0/1 answer reward: groups never tie, so both steps really train."""
    return [-0.01 * len(text) for text in completions]


class PromptSpy:
    """Records the prompt token ids of every ``vllm.LLM.generate`` call and what vLLM says it received."""

    def __init__(self) -> None:
        self.sent: list[list[int]] = []
        self.received: list[list[int]] = []

    def wrap(self, generate: Any) -> Any:
        def spied(llm: Any, prompts: Any, *args: Any, **kwargs: Any) -> Any:
            outputs = generate(llm, prompts, *args, **kwargs)
            self.sent += [list(p["prompt_token_ids"]) for p in prompts]
            self.received += [list(o.prompt_token_ids) for o in outputs]
            return outputs

        return spied


def fit_two_steps(tmp: Path, lora: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, MemoryLogger, PromptSpy]:
    from vllm import LLM

    if not (FOLDER / "config.json").is_file():
        pytest.skip(f"{FOLDER} not imported (bash scripts/setup.sh imports it)")
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["trainer"].update(
        max_steps=2, val_check_interval=2, enable_progress_bar=False, callbacks=[], default_root_dir=str(tmp)
    )
    cfg["rollout"].update(val_samples=1, sync_tolerance=SYNC_TOLERANCE, validate_at_start=False)
    cfg["rollout"].update(reward_funcs=["last_number", f"{__name__}:brevity_reward"], correctness="last_number")
    cfg["rollout"]["sampling"].update(n=2, max_tokens=4)
    cfg["model"]["policy"].update(model=str(FOLDER), save_pretrained_dir=None)
    if not lora:
        cfg["model"]["policy"]["lora"] = None
    cfg["model"]["optimizer"]["lr"] = 1e-3 if lora else 1e-5
    cfg["model"]["val_pass_at_k"] = [1]
    cfg["data"]["splits"].update(num_train=8, num_val=2, num_test=0)
    cfg["data"]["loader"].update(prompts_per_step=2)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    spy = PromptSpy()
    monkeypatch.setattr(LLM, "generate", spy.wrap(LLM.generate))
    cli = cli_main(
        ["--config", str(path), "--config", str(VLLM_OVERLAY)], run=False, trainer_defaults={"logger": False}
    )
    logger = MemoryLogger()
    cli.trainer.logger = logger
    before = {k: v.detach().clone() for k, v in cli.model.policy.named_parameters() if v.requires_grad}
    cli.trainer.fit(cli.model, cli.datamodule)
    params = cli.model.policy.named_parameters()
    moved = max(float((v.detach() - before[k]).abs().max()) for k, v in params if k in before)
    assert moved > 0
    return cli, logger, spy


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_two_rl_steps_on_the_real_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lora: bool) -> None:
    cli, logger, spy = fit_two_steps(tmp_path, lora, monkeypatch)
    tokenizer = cli.datamodule.tokenizer
    # The engine receives the chat template's rendering of each question, token for token.
    questions = {r.columns["expression"]: r.prompt_ids for r in cli.datamodule.splits["train"]}
    for expression, ids in list(questions.items())[:4]:
        turn = [{"role": "user", "content": f"What is {expression}? Reply with just the number."}]
        assert ids == list(tokenizer.apply_chat_template(turn, add_generation_prompt=True, return_dict=False))
    assert spy.sent and spy.sent == spy.received
    sent = set(map(tuple, spy.sent))  # the sampling calls, and the sync check's scoring of prompt + completion
    for step in range(2):
        assert all(tuple(r.prompt_ids) in sent for r in cli.datamodule.train_batch(step))
    # Every push was checked (a gap above the tolerance raises WeightSyncError and stops fit).
    deltas = logger.points("rollout/sync_logprob_delta")
    assert len(deltas) >= 2, deltas
    assert all(0 <= delta < SYNC_TOLERANCE / 10 for _, delta in deltas), deltas
    assert cli.model.is_lora == lora
