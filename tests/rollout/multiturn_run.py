"""A multi-turn fit through ``lit-fgrpo fit`` (LightningCLI), launched as a user launches it: 1 process or 2 DDP ranks.

    multiturn_run.py OUT TOKENIZER --devices 2     # Lightning's ddp launcher re-runs this script for rank 1

The tiny chat policy (:mod:`tests.rollout.multiturn_setup`) runs ``Parity`` episodes on arithmetic prompts, 4 global
prompts per step. Every rank writes its final weights and logged statistics (``RecordPrompts`` of the maze worker).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from lit_fgrpo.cli import cli_main
from tests.rollout.multiturn_setup import CHAT_MODEL, MULTI_TURN, stops


def config(out: Path, tokenizer: str, devices: int, steps: int) -> dict[str, Any]:
    return {
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("tokenizer")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"config.{os.getpid()}.json"
    path.write_text(json.dumps(config(args.out, args.tokenizer, args.devices, args.steps)))
    sys.exit(0 if cli_main(["fit", "--config", str(path)]) is not None else 1)


if __name__ == "__main__":
    main()
