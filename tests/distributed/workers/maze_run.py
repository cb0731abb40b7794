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
from pathlib import Path
from typing import Any

import lightning as L
import torch

from lit_fgrpo.cli import cli_main
from lit_fgrpo.data.data_settings import grouped_data_settings
from lit_fgrpo.distributed.weight_gather import iter_full_weights
from lit_fgrpo.training.module_settings import grouped_settings
from tests.training.tiny_setup import MAZE_TINY_MODEL  # importable: the launcher puts the repo on PYTHONPATH


def config(
    out: Path, devices: int, num_nodes: int, steps: int, prompts_per_step: int, strategy: str = "ddp"
) -> dict[str, Any]:
    """maze_tiny.yaml, self-contained and shortened: no checkpoints, no logger, no validation, a dense extra reward."""
    world = devices * num_nodes
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": devices,
            "num_nodes": num_nodes,
            "strategy": strategy if world > 1 else "auto",
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
                # never reached here; its running total is logged, and must be the global one on every rank
                {"class_path": "lit_fgrpo.callbacks.GeneratedTokenBudget", "init_args": {"max_tokens": 10**9}},
                {"class_path": "tests.distributed.workers.maze_run.RecordPrompts", "init_args": {"out": str(out)}},
            ],
        },
        "rollout": {
            "engine": "hf",
            "sampling": {"n": 8, "temperature": 1.0, "max_tokens": 16, "stop_token_ids": [7]},
            "val_samples": 8,
            # the dense word-count term makes most groups active from the start, so that the ranks'
            # gradients differ and the all-reduce is really tested
            "reward_funcs": ["maze", "tests.training.tiny_setup:word_count_reward"],
            # a verdict that a barely trained policy meets sometimes: pass@k and the focal weights are
            # then not trivially 0 and 1 in the comparisons
            "correctness": "tests.training.tiny_setup:word_count_reward",
            "sync_every": 1,
            "log_samples_every": 0,
            "validate_at_start": False,
            "seed": 0,
        },
        "model": {
            "model_config": dict(MAZE_TINY_MODEL),
            "tokenizer": "builtin:maze",
            "gamma": 0.5,
            "loss_type": "grpo",
            "lr": 1.0e-3,
            "max_grad_norm": 1.0,
            "micro_batch_rows": 128,
            # skip_zero_advantage (the default) leaves ranks with different numbers of backwards; the module
            # pads them with zero-loss backwards so that DDP's all-reduces line up
            "skip_zero_advantage": True,
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
        self.logged: list[dict[str, float]] = []
        self.drawn: list[list[int]] = []  # with dynamic sampling: the prompts drawn in each step's rounds
        self.cursor: list[int] = []  # and the data module's draw cursor after each step
        self._pending: list[int] = []

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        datamodule: Any = trainer.datamodule  # type: ignore[attr-defined]
        draw_prompts = datamodule.draw_prompts

        def recording_draw(count: int) -> Any:  # the instance's method, wrapped to see what dynamic sampling draws
            records = draw_prompts(count)
            self._pending.extend(int(record.position) for record in records)
            return records

        datamodule.draw_prompts = recording_draw

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.seen.append([record.position for record in batch.records])

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        metrics = trainer.callback_metrics
        self.active.append(float(metrics.get("rollout/frac_active_groups", float("nan"))))
        self.logged.append(
            {k: float(v) for k, v in metrics.items() if k.startswith(("rollout/", "focal/", "train/nonfinite"))}
        )
        self.drawn.append(self._pending)
        self._pending = []
        self.cursor.append(int(trainer.datamodule.drawn_prompts))  # type: ignore[attr-defined]

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        rank = trainer.global_rank
        val = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        summary = {
            "world_size": trainer.world_size,
            "positions": self.seen,
            "frac_active_groups": self.active,
            "logged": self.logged,
            "drawn": self.drawn,
            "cursor": self.cursor,
            "val": val,
        }
        (self.out / f"rank{rank}.json").write_text(json.dumps(summary))
        policy: Any = pl_module.policy
        # full weights under HF names, gathered one tensor at a time when sharded (every rank takes part)
        full = {name: tensor.detach().clone() for name, tensor in iter_full_weights(policy)}
        torch.save(full, self.out / f"rank{rank}.pt")
        optimizer = trainer.optimizers[0]
        shards = {}
        for name, p in policy.named_parameters():
            state = optimizer.state.get(p, {})
            moments = [_local(state[k]) for k in ("exp_avg", "exp_avg_sq") if k in state]
            shards[name] = {
                "dtensor": hasattr(p, "to_local"),
                "local": p.to_local().numel() if hasattr(p, "to_local") else 0,
                "element_size": p.element_size(),
                "trainable": p.requires_grad,
                # this rank's AdamW moment bytes and step count (the memory plan and the non-finite guard's test)
                "moment_bytes": sum(m.numel() * m.element_size() for m in moments),
                "adam_steps": float(state["step"]) if "step" in state else 0.0,
            }
        (self.out / f"rank{rank}.shards.json").write_text(json.dumps(shards))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def this_rank(devices: int) -> int:
    """The global rank of this process, from what the launchers set (Lightning's ddp launcher: ``LOCAL_RANK`` in the
    child processes; the simulated nodes: ``NODE_RANK``)."""
    return int(os.environ.get("NODE_RANK", "0")) * devices + int(os.environ.get("LOCAL_RANK", "0"))


class PoisonWeights(L.Callback):
    """Makes the policy's weights NaN on ``rank`` at training step ``step``, after the rollout: a NaN loss there."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            policy: Any = pl_module.policy
            with torch.no_grad():
                policy.get_input_embeddings().weight.fill_(float("nan"))


class PoisonGradShard(L.Callback):
    """After each backward of training batch ``step`` on ``rank``: one element of this rank's gradient shard (of the
    first parameter with one) becomes NaN. The other rank's shards and its loss stay finite: only an agreement across
    ranks makes both skip the step. (By batch, not ``global_step``: a skipped step does not advance that.)"""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step, self.batch = rank, step, -1

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.batch = batch_idx

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_rank != self.rank or self.batch != self.step:
            return
        policy: Any = pl_module.policy
        for param in policy.parameters():
            if param.grad is not None and _local(param.grad).numel() > 0:
                _local(param.grad).view(-1)[0] = float("nan")
                return


def flat_reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
    """The same reward for every completion: every group has zero advantage, so every row is skipped."""
    return [0.0] * len(completions)


def install_rollout_crash(rank: int, fail_step: int) -> None:
    """An exception escaping the rollout on ``rank`` at ``step``. (Reward scoring turns a reward function's own
    exception into an unscorable row, so the crash is raised from the collector, as a broken reward setup would.)"""
    from lit_fgrpo.rollout.collect import RolloutCollector

    original = RolloutCollector.collect

    def collect(self: Any, records: Any, sampling: Any, seed: Any = None, step: int = 0, stream: int = 0) -> Any:
        if step == fail_step and stream == 0:
            raise ValueError(f"reward function maze crashed on rank {rank}")
        return original(self, records, sampling, seed, step, stream)

    RolloutCollector.collect = collect  # type: ignore[method-assign,assignment]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--warm-steps", type=int, default=20)
    parser.add_argument("--ckpt-every", type=int, default=0, help="save a checkpoint every k steps to OUT/ckpt")
    parser.add_argument("--resume", type=Path, default=None, help="a checkpoint to resume from")
    parser.add_argument("--validate", action="store_true", help="validation pass@k after the last step")
    parser.add_argument("--fail-rank", type=int, default=None, help="the rank that fails at step 1")
    parser.add_argument(
        "--flat-reward-rank", type=int, default=None, help="a rank whose groups all have zero advantage"
    )
    parser.add_argument("--strategy", default="ddp", help="the strategy of a multi-rank run (ddp, model_parallel)")
    parser.add_argument("--beta", type=float, default=0.0, help="KL coefficient (> 0: a frozen reference)")
    parser.add_argument("--fail-kind", choices=["rollout", "sync", "nan", "nangrad"], default="rollout")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (r 4) instead of all weights")
    parser.add_argument("--decode-dtype", default="float32", help="--rollout.decode_dtype (the HF engine's matmuls)")
    parser.add_argument(
        "--micro-batch-tokens", type=int, default=None, help="--model.batching.micro_batch_tokens (a token budget)"
    )
    parser.add_argument("--dynamic", action="store_true", help="dynamic sampling, a reward with constant groups")
    parser.add_argument("--dynamic-short-error", action="store_true", help="one round, on_short=error")
    parser.add_argument(
        "--server", action="store_true", help="rollouts on one launched vllm serve, shared by the ranks"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    settings = config(args.out, args.devices, args.num_nodes, args.steps, args.prompts_per_step, args.strategy)
    settings["model"]["beta"] = args.beta
    settings["rollout"]["decode_dtype"] = args.decode_dtype
    settings["model"]["micro_batch_tokens"] = args.micro_batch_tokens
    if args.lora:  # the reference is then the policy with its adapters disabled
        settings["model"]["lora"] = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]}
    trainer, callbacks = settings["trainer"], settings["trainer"]["callbacks"]
    callbacks[0]["init_args"]["steps"] = args.warm_steps
    if args.ckpt_every:
        trainer["enable_checkpointing"] = True
        checkpoint = {"dirpath": str(args.out / "ckpt"), "every_n_train_steps": args.ckpt_every, "save_top_k": -1}
        callbacks.append({"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": checkpoint})
    if args.resume is not None:
        settings["ckpt_path"] = str(args.resume)
    if args.validate:
        trainer |= {"limit_val_batches": None, "val_check_interval": args.steps, "check_val_every_n_epoch": None}
        settings["model"]["val_pass_at_k"] = [1, 4]
    if args.dynamic:
        half = "tests.training.test_dynamic_sampling_training:half_constant_reward"  # half the groups constant
        dynamic = {"max_rounds": 6, "oversample": 1.5}
        if args.dynamic_short_error:
            dynamic = {"max_rounds": 1, "oversample": 1.0, "on_short": "error"}
        settings["rollout"] |= {"reward_funcs": [half], "correctness": half, "dynamic_sampling": dynamic}
    if args.server:
        from tests.distributed.workers.server_checks import use_servers

        use_servers(settings, args.out)
    if args.flat_reward_rank is not None and args.flat_reward_rank == this_rank(args.devices):
        flat = "tests.distributed.workers.maze_run:flat_reward"
        settings["rollout"] |= {"reward_funcs": [flat], "correctness": flat}
    if args.fail_rank is not None and args.fail_rank == this_rank(args.devices):
        if args.fail_kind == "rollout":
            install_rollout_crash(args.fail_rank, fail_step=1)
        elif args.fail_kind == "sync":
            # this rank's engine "disagrees" with the policy; hf_copy has weights of its own, so the check runs (the
            # plain HF engine samples with the policy itself and skips the probe)
            settings["rollout"] |= {"sync_tolerance": -1.0, "engine": "hf_copy"}
        else:
            poison = {"rank": args.fail_rank, "step": 1}
            name = "PoisonWeights" if args.fail_kind == "nan" else "PoisonGradShard"
            callbacks.append({"class_path": f"tests.distributed.workers.maze_run.{name}", "init_args": poison})
    path = args.out / f"config.{os.getpid()}.json"
    settings["model"] = grouped_settings(settings["model"])  # written flat above for short edits; the CLI's groups
    settings["data"] = grouped_data_settings(settings["data"])  # likewise the data module's
    path.write_text(json.dumps(settings))  # one file per process: Lightning re-runs this script for each rank
    sys.exit(0 if cli_main(["fit", "--config", str(path)]) is not None else 1)


if __name__ == "__main__":
    main()
