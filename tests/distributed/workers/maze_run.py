"""The maze_tiny pipeline through ``lit-fgrpo fit`` (LightningCLI), launched the way a user launches it.

    maze_run.py OUT --devices 2                        # Lightning's ddp launcher re-runs this script for rank 1
    NODE_RANK=i WORLD_SIZE=2 maze_run.py OUT --num-nodes 2   # one process per simulated node (MASTER_ADDR/PORT)

Every rank writes its final policy weights to ``OUT/rank{global_rank}.pt`` (rank 0 also ``OUT/policy`` through
``save_pretrained_dir``) and ``OUT/rank{r}.txt`` with the world size and this rank's training prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
import torch

from lit_fgrpo.cli import cli_main


def config(out: Path, devices: int, num_nodes: int, steps: int, prompts_per_step: int) -> dict[str, Any]:
    """maze_tiny.yaml, self-contained and shortened: no checkpoints, no logger, no validation, a dense extra reward."""
    world = devices * num_nodes
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": devices,
            "num_nodes": num_nodes,
            "strategy": "ddp" if world > 1 else "auto",
            "max_steps": steps,
            "limit_val_batches": 0,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "callbacks": [
                {
                    "class_path": "lit_fgrpo.callbacks.WarmStartCallback",
                    "init_args": {"steps": 20, "batch_size": 64, "lr": 1.0e-3},
                },
                {
                    "class_path": "lit_fgrpo.callbacks.RolloutCallback",
                    "init_args": {
                        "engine": "hf",
                        "sampling": {"n": 8, "temperature": 1.0, "max_tokens": 16, "stop_token_ids": [7]},
                        "val_samples": 8,
                        # maze is the verdict; the dense word-count term makes every group active from the
                        # start, so that the ranks' gradients differ and the all-reduce is really tested
                        "reward_funcs": ["maze", "tests.training.tiny_setup:word_count_reward"],
                        "correctness": "maze",
                        "sync_every": 1,
                        "log_samples_every": 0,
                        "validate_at_start": False,
                        "seed": 0,
                    },
                },
                {"class_path": "tests.distributed.workers.maze_run.RecordPrompts", "init_args": {"out": str(out)}},
            ],
        },
        "model": {
            "model_config": {
                "model_type": "llama",
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "intermediate_size": 64,
                "max_position_embeddings": 160,
                "tie_word_embeddings": True,
            },
            "tokenizer": "builtin:maze",
            "gamma": 0.5,
            "loss_type": "grpo",
            "lr": 1.0e-3,
            "max_grad_norm": 1.0,
            "micro_batch_rows": 128,
            # DDP all-reduces in every backward: every rank must run the same number of them (see the report)
            "skip_zero_advantage": False,
            "save_pretrained_dir": str(out / "policy"),
        },
        "data": {
            "source": "maze",
            "maze_rows": 4,
            "maze_cols": 4,
            "num_train": 300,
            "num_val": 8,
            "num_test": 8,
            "prompts_per_step": prompts_per_step,
            "val_size": 8,
            "seed": 0,
        },
    }


class RecordPrompts(L.Callback):
    """Writes which prompts (global positions) this rank trained on, the world size and the final weights."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.seen: list[list[int | None]] = []
        self.active: list[float] = []

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.seen.append([record.position for record in batch])

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.active.append(float(trainer.callback_metrics.get("rollout/frac_active_groups", float("nan"))))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        rank = trainer.global_rank
        summary = {"world_size": trainer.world_size, "positions": self.seen, "frac_active_groups": self.active}
        (self.out / f"rank{rank}.json").write_text(json.dumps(summary))
        policy: Any = pl_module.policy
        torch.save({k: v.detach().clone() for k, v in policy.state_dict().items()}, self.out / f"rank{rank}.pt")


def install_per_prompt_seeds() -> None:
    """Sample every training prompt alone, seeded by ``prompt_seed(seed, position, step)``, instead of one batch-wide
    ``seed + step``: what the rollout collector must do for results independent of the rank layout. Installed by
    wrapping the callback's public ``make_rollout`` (the callbacks are being refactored; this is the test's stand-in).
    """
    from lit_fgrpo.callbacks import RolloutCallback
    from lit_fgrpo.distributed import prompt_seed
    from lit_fgrpo.rollout.base import Generation, SamplingConfig

    original = RolloutCallback.make_rollout

    def make_rollout(self: Any, pl_module: Any, records: list[Any], sampling: SamplingConfig) -> Any:
        engine = self.engine
        if not pl_module.trainer.training:
            return original(self, pl_module, records, sampling)
        step = pl_module.trainer.global_step
        batched = engine.generate

        def generate(prompt_ids: list[list[int]], config: SamplingConfig) -> Generation:
            parts = [
                batched([ids], replace(config, seed=prompt_seed(self.seed, record.position, step)))
                for ids, record in zip(prompt_ids, records)
            ]
            logps = [p.sampling_logprobs for p in parts]
            return Generation(
                completion_ids=[row for p in parts for row in p.completion_ids],
                sampling_logprobs=None if any(lp is None for lp in logps) else [r for lp in logps for r in lp or []],
                finished=[done for p in parts for done in p.finished],
            )

        engine.generate = generate
        try:
            return original(self, pl_module, records, sampling)
        finally:
            del engine.generate  # back to the class's method

    RolloutCallback.make_rollout = make_rollout  # type: ignore[method-assign]


def install_failure(fail_rank: int) -> None:
    """Wrap every training rollout in ``fail_together`` (as the collector should) and crash the reward on
    ``fail_rank`` at step 1: every rank must stop with the message instead of waiting in the next all-reduce."""
    from lit_fgrpo.callbacks import RolloutCallback
    from lit_fgrpo.distributed import fail_together

    original = RolloutCallback.make_rollout

    def make_rollout(self: Any, pl_module: Any, records: list[Any], sampling: Any) -> Any:
        step = pl_module.trainer.global_step
        with fail_together(f"rollout scoring at step {step}"):
            if pl_module.global_rank == fail_rank and step == 1:
                raise ValueError(f"reward function maze crashed on rank {fail_rank}")
            rollout = original(self, pl_module, records, sampling)
        return rollout

    RolloutCallback.make_rollout = make_rollout  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--per-prompt-seeds", action="store_true", help="see install_per_prompt_seeds")
    parser.add_argument("--fail-rank", type=int, default=None, help="see install_failure")
    args = parser.parse_args()
    if args.per_prompt_seeds:
        install_per_prompt_seeds()
    if args.fail_rank is not None:
        install_failure(args.fail_rank)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = config(args.out, args.devices, args.num_nodes, args.steps, args.prompts_per_step)
    path = args.out / f"config.{os.getpid()}.json"
    path.write_text(json.dumps(settings))  # one file per process: Lightning re-runs this script for each rank
    sys.exit(0 if cli_main(["fit", "--config", str(path)]) is not None else 1)


if __name__ == "__main__":
    main()
