"""A multi-turn fit through ``lit-fgrpo fit`` (LightningCLI), launched as a user launches it: 1 process or 2 DDP ranks.

    multiturn_run.py OUT TOKENIZER --devices 2     # Lightning's ddp launcher re-runs this script for rank 1
    multiturn_run.py OUT TOKENIZER --tools         # the calculator, after a conversation warm start

The tiny chat policy (:mod:`tests.rollout.multiturn_setup`) runs ``Parity`` episodes on arithmetic prompts, 4 global
prompts per step. Every rank writes its final weights and logged statistics (``RecordPrompts`` of the maze worker).
With ``--tools``: ``calculator`` episodes after 2 warm-start steps on generated transcripts, the held-out questions
answered before the warm start (``evaluate_base``) and before RL; each rank writes both rows (``RecordStages``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import lightning as L

from lit_fgrpo.callbacks import RolloutCallback
from lit_fgrpo.callbacks.conversation_warm_start import ConversationWarmStart
from lit_fgrpo.cli import cli_main
from tests.rollout.multiturn_setup import CHAT_MODEL, MULTI_TURN, stops


class RecordStages(L.Callback):
    """Writes the held-out rows of the base model and of the warm-started one (``stages<rank>.json``)."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        rows: dict[str, dict[str, float]] = {}
        for callback in trainer.callbacks:  # type: ignore[attr-defined]
            if isinstance(callback, ConversationWarmStart):
                rows["base"] = callback.base_values
            if isinstance(callback, RolloutCallback):
                rows["start"] = callback.start_pass_at_k
        (self.out / f"stages{trainer.global_rank}.json").write_text(json.dumps(rows))


def tool_settings(out: Path) -> dict[str, Any]:
    """The overrides of ``--tools``: the calculator after a warm start that evaluates the base model first."""
    warm_start = {
        "class_path": "lit_fgrpo.callbacks.ConversationWarmStart",
        "init_args": {
            "generator": "lit_fgrpo.environments.calculator_transcripts:calculator_transcripts",
            "generator_args": {"limit": 16},
            "steps": 2, "batch_size": 4, "micro_batch_rows": 2, "lr": 1.0e-2, "held_out": 4, "evaluate_base": True,
        },
    }  # fmt: skip
    return {
        "callbacks": [warm_start, {"class_path": f"{__name__}.RecordStages", "init_args": {"out": str(out)}}],
        "rollout": {
            "environment": "calculator", "reward_funcs": ["last_number"], "validate_at_start": True,
            "sampling": {"n": 4, "temperature": 1.0, "max_tokens": 12, "stop_token_ids": stops()},
        },
        "arithmetic": {"min_value": 10, "max_value": 99, "operators": ["*"]},
    }  # fmt: skip


def config(out: Path, tokenizer: str, devices: int, steps: int, tools: bool = False) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": devices,
            "strategy": "ddp" if devices > 1 else "auto",
            "max_steps": steps,
            "limit_val_batches": None,
            "val_check_interval": steps,
            "check_val_every_n_epoch": None,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "callbacks": [
                {"class_path": "tests.distributed.workers.maze_run.RecordPrompts", "init_args": {"out": str(out)}}
            ],
        },
        "rollout": {
            "engine": "hf",
            "sampling": {"n": 4, "temperature": 1.0, "max_tokens": 6, "stop_token_ids": stops()},
            "environment": MULTI_TURN,
            "max_turns": 2,
            "max_episode_tokens": 32,
            "val_samples": 4,
            "validate_at_start": False,
            "seed": 0,
        },
        "model": {
            "policy": {"model_config": dict(CHAT_MODEL), "tokenizer": tokenizer},
            "objective": {"gamma": 0.5, "loss_type": "grpo"},
            "optimizer": {"lr": 1.0e-3},
            "val_pass_at_k": [1, 2],
        },
        "data": {
            "source": "arithmetic",
            "arithmetic": {"max_value": 9},
            "splits": {"num_train": 32, "num_val": 4, "num_test": 4, "val_size": 4},
            "loader": {"prompts_per_step": 4},
            "seed": 0,
        },
    }
    if tools:
        extra = tool_settings(out)
        settings["trainer"]["callbacks"] += extra["callbacks"]
        settings["rollout"] |= extra["rollout"]
        settings["data"]["arithmetic"] = extra["arithmetic"]
        settings["model"]["policy"]["model_config"]["max_position_embeddings"] = 1024  # the tools' system prompt
    return settings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("tokenizer")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tools", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"config.{os.getpid()}.json"
    path.write_text(json.dumps(config(args.out, args.tokenizer, args.devices, args.steps, args.tools)))
    sys.exit(0 if cli_main(["fit", "--config", str(path)]) is not None else 1)


if __name__ == "__main__":
    main()
