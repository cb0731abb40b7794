"""One bf16 policy update of a randomly initialised ~0.5B Qwen2, vLLM colocated with sleep mode: where the time goes.

    python benchmarks/gpu_step.py                 # on one H200 (scripts/gpu_check.sh runs it)
    python benchmarks/gpu_step.py --engine hf     # the same with the HF engine, where vLLM is not installed
    python benchmarks/gpu_step.py --cpu-smoke     # the same code path on the CPU: tiny Qwen2, HF engine, 2 steps

Builds the model from a config (no download) with a 32k-word tokenizer (the maze words plus filler words, so a
random policy rarely samples EOS and completions run to ``--max-tokens``), and trains through the library's own
Lightning path: ``FGRPOModule`` + ``PromptDataModule`` (maze prompts) + ``RolloutCallback``. Prints, per step after
the first (warm-up), the time split into generate / log-probs / train / sync, tokens per second, MFU and peak
memory, then the medians.

Phases: *generate* is the engine's sampling time (``RolloutBatch.stats``); *log-probs* is a timed no-grad pass of
the policy over the rollout (what the old-policy / reference pass costs when ``num_iterations > 1``, mini-batches
or ``beta > 0`` ask for it); *train* is ``training_step`` (forward, backward, optimizer) on the batch; *sync* is the
weight push into the engine with its log-prob check (``rollout/sync_seconds``). MFU counts 2N FLOPs per token for
generation and log-probs and 6N for training (N parameters; attention FLOPs left out), over the step's wall time,
against ``--peak-tflops`` (H200 dense bf16: 989).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import Logger

from lit_fgrpo.callbacks import RolloutCallback
from lit_fgrpo.data import (
    LoaderSettings,
    PromptDataModule,
    PromptSettings,
    SplitSettings,
)
from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.models.logprobs import completion_logprobs
from lit_fgrpo.rollout.batch import RolloutBatch
from lit_fgrpo.tasks.maze import MAZE_VOCAB, MazeConfig
from lit_fgrpo.tasks.word_tokenizer import build_word_tokenizer
from lit_fgrpo.training.module import FGRPOModule
from lit_fgrpo.training.module_settings import BatchingSettings, ObjectiveSettings, OptimizerSettings, PolicySettings

QWEN2_05B = {  # Qwen2.5-0.5B's shape with a 32k vocabulary: 28 layers x 17.2M + 33.6M embedding = 0.52B parameters
    "model_type": "qwen2",
    "hidden_size": 1024,
    "intermediate_size": 4864,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}
TINY_QWEN2 = {
    "model_type": "qwen2",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}


class MetricsLog(Logger):
    """Keeps every logged metric in memory (``rollout/sync_seconds`` reaches only the logger)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))


class PhaseTimer(L.Callback):
    """Times a step's phases; placed after the RolloutCallback, so its hooks run after the rollout and the sync."""

    def __init__(self, logger: MetricsLog, num_params: int, peak_flops: float | None) -> None:
        self.logger, self.num_params, self.peak_flops = logger, num_params, peak_flops
        self.rollout: RolloutBatch | None = None
        self.steps: list[dict[str, float]] = []

    @staticmethod
    def _now() -> float:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    @torch.no_grad()
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        # The rollout callback runs first (it is listed first) and attaches the scored rollout to the batch.
        self.rollout = batch.take_rollout()
        rollout = self.rollout.to(pl_module.device)
        start = self._now()
        completion_logprobs(
            pl_module.policy,
            rollout.input_ids,
            rollout.attention_mask,
            rollout.completion_length,
            temperature=pl_module.temperature,
            chunk_rows=pl_module.batching.logprob_chunk_rows,
        )
        self.logprob_seconds = self._now() - start
        self.train_start = self._now()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        end = self._now()
        assert self.rollout is not None
        sync = [m["rollout/sync_seconds"] for step, m in self.logger.rows if "rollout/sync_seconds" in m]
        sync_seconds = sync[-1] if sync else 0.0
        rows, width = self.rollout.input_ids.shape  # (B, Tp + T)
        generated = float(self.rollout.completion_mask.sum())
        processed = float(self.rollout.attention_mask.sum())
        step = {
            "generate": float(self.rollout.stats["generation_seconds"]),
            "log-probs": self.logprob_seconds,
            "train": end - self.train_start - sync_seconds,
            "sync": sync_seconds,
        }
        step["total"] = sum(step.values())
        step["tokens/s"] = processed / step["total"]
        step["generated tokens/s"] = generated / step["generate"]
        flops = 2 * self.num_params * processed * 2 + 6 * self.num_params * rows * width  # generate, log-probs, train
        if self.peak_flops:
            step["MFU"] = flops / step["total"] / self.peak_flops
            step["train MFU"] = 6 * self.num_params * rows * width / step["train"] / self.peak_flops
        if torch.cuda.is_available():
            step["peak GiB"] = torch.cuda.max_memory_allocated() / 2**30
            free, total = torch.cuda.mem_get_info()
            step["device used GiB"] = (total - free) / 2**30
        self.steps.append(step)
        print(f"step {trainer.global_step}: " + "  ".join(f"{k} {v:.3g}" for k, v in step.items()), flush=True)


def tokenizer_dir(vocab_size: int, root: Path) -> str:
    words = list(MAZE_VOCAB) + [f"w{i}" for i in range(vocab_size - len(MAZE_VOCAB))]
    path = root / "tokenizer"
    build_word_tokenizer(words).save_pretrained(path)
    return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny model, HF engine, CPU: proves the code path")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps (the first is warm-up)")
    parser.add_argument("--prompts", type=int, default=64, help="prompts per step (global)")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt G")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--micro-batch-rows", type=int, default=16)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the accelerator")
    parser.add_argument(
        "--engine",
        choices=("vllm", "hf"),
        default="vllm",
        help="generation engine on the GPU: vLLM colocated with sleep mode, or the HF engine (where vLLM is absent)",
    )
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        args.steps, args.prompts, args.group, args.max_tokens, args.micro_batch_rows = 2, 4, 4, 8, 16
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="gpu_step_") as tmp:
        vocab = 64 if args.cpu_smoke else 32768
        tokenizer = tokenizer_dir(vocab, Path(tmp))
        model = FGRPOModule(
            policy=PolicySettings(
                model_config=(TINY_QWEN2 if args.cpu_smoke else QWEN2_05B) | {"vocab_size": vocab},
                tokenizer=tokenizer,
                gradient_checkpointing=not args.cpu_smoke,
            ),
            objective=ObjectiveSettings(loss_type="dapo"),
            optimizer=OptimizerSettings(lr=1e-6),
            # skip_zero_advantage off: time the full batch whatever the random rewards are
            batching=BatchingSettings(micro_batch_rows=args.micro_batch_rows, skip_zero_advantage=False),
        )
        num_params = sum(p.numel() for p in model.policy.parameters())
        print(f"policy: {num_params / 1e6:.1f}M parameters, vocab {vocab}", flush=True)
        data = PromptDataModule(
            source="maze",
            maze=MazeConfig(rows=7, cols=7),
            splits=SplitSettings(num_train=4 * args.prompts, num_val=0, num_test=0, val_size=0),
            prompts=PromptSettings(max_length=1024),
            loader=LoaderSettings(prompts_per_step=args.prompts),
            tokenizer_path=tokenizer,
        )
        sampling = SamplingConfig(n=args.group, temperature=1.0, max_tokens=args.max_tokens)
        if args.cpu_smoke or args.engine == "hf":
            rollout = RolloutCallback(engine="hf", sampling=sampling, validate_at_start=False, log_samples_every=0)
        else:
            engine_kwargs = {
                "dtype": "bfloat16",
                "gpu_memory_utilization": args.gpu_memory_utilization,
                "enable_sleep_mode": True,
                "max_model_len": 2048,
            }
            rollout = RolloutCallback(
                engine="vllm",
                sampling=sampling,
                validate_at_start=False,
                log_samples_every=0,
                sync_tolerance=0.25,  # bf16 engine vs bf16 trainer kernels
                engine_kwargs=engine_kwargs,
            )
        logger = MetricsLog()
        timer = PhaseTimer(logger, num_params, None if args.cpu_smoke else args.peak_tflops * 1e12)
        trainer = L.Trainer(
            accelerator="cpu" if args.cpu_smoke else "gpu",
            devices=1,
            precision="bf16-true",
            max_steps=args.steps,
            limit_val_batches=0,
            logger=logger,
            callbacks=[rollout, timer],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        )
        trainer.fit(model, data)
    measured = timer.steps[1:] or timer.steps
    print(f"\nmedian over {len(measured)} step(s) after the warm-up step:")
    for key in measured[0]:
        print(f"  {key:<20} {statistics.median(s[key] for s in measured):.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
