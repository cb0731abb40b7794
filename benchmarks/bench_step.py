"""One RL step, lit_fgrpo against TRL's GRPOTrainer: same model, prompts, batch and completion lengths.

Cases (issue #15):
  a  both on HF ``generate``, matched settings (loss grpo, beta 0, fp32, no gradient checkpointing, lr, T, G)
  b  each library out of the box: ours ``engine="auto"`` (vLLM when installed), TRL's GRPOConfig defaults
     (gradient checkpointing, bf16 autocast, loss dapo), only the batch shape and step count set
  c  case a at a real vocabulary (151,936 tokens, Qwen2.5's) with 512-token completions; peak RSS both sides
  r  the real model (SmolLM2-135M-Instruct, imported by scripts/setup.sh into models/), matched as in case a,
     full fine-tuning: arithmetic questions as plain-text prompts on both sides
  l  case r with LoRA (r 16, alpha 32, the 7 linear projections) on both sides (TRL: ``peft_config``)
  d  the real model with each library's defaults, as in case b (ours: vLLM, whose CPU engine runs in its own
     process on the second core; TRL: HF ``generate``, gradient checkpointing, bf16 autocast, loss dapo)

Each contender runs in its own process (``--worker``), contenders alternate in order every repetition, and the
table gives medians over repetitions of each run's median step time (the first ``--warmup`` steps dropped: they
include engine start-up and lazy initialisation). Step time = wall time between the starts of consecutive
training steps (generation, reward, log-probs, forward, backward, optimizer, weight sync: everything).
Peak RSS is the worker's ``ru_maxrss``: in case b it leaves out a vLLM engine running in its own process (vLLM's
default multiprocess mode), so compare memory in cases a and c.

    python benchmarks/bench_step.py --quick          # smoke test, ~2 min (vLLM start-up dominates)
    python benchmarks/bench_step.py --cases a c      # real settings, about 25 min on 2 idle cores
    python benchmarks/bench_step.py --cases r l --reps 3   # the real model, about 20 min on 2 idle cores
    python benchmarks/bench_step.py --cases r l --reps 3 --lit-decode-dtype auto   # ours decoding in bfloat16 where
                                                           # the CPU has AVX512-BF16 or AMX (TRL's side unchanged)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@dataclass
class Case:
    name: str
    hidden: int
    layers: int
    vocab: int
    prompts: int
    """P prompts per step."""
    group: int
    """G completions per prompt."""
    prompt_len: int
    max_tokens: int
    steps: int
    """Training steps per run, warm-up included."""
    matched: bool = True
    """True: HF generate and the same settings on both sides; False: each library's defaults."""
    model: str | None = None
    """A real model's folder (relative to the repository); None builds a random Qwen2 of the sizes above."""
    lora_rank: int = 0
    """LoRA rank on both sides (0 = full fine-tuning)."""
    decode_dtype: str = "float32"
    """Our HF engine's decoding matmuls (``--rollout.decode_dtype``; ``--lit-decode-dtype``). TRL's side is unchanged:
    its matched cases generate in float32 (``generate`` offers no other dtype than the model's)."""


REAL_MODEL = "models/SmolLM2-135M-Instruct"
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


CASES = {
    "a": Case("a: HF generate, matched", hidden=128, layers=2, vocab=1000, prompts=8, group=8, prompt_len=32,
              max_tokens=64, steps=5),
    "b": Case("b: out-of-the-box defaults", hidden=128, layers=2, vocab=1000, prompts=8, group=8, prompt_len=32,
              max_tokens=64, steps=5, matched=False),
    "c": Case("c: V=151,936, 512 tokens", hidden=128, layers=2, vocab=151_936, prompts=2, group=4, prompt_len=32,
              max_tokens=512, steps=3),
    "r": Case("r: SmolLM2, matched, full", hidden=576, layers=30, vocab=49_152, prompts=4, group=4, prompt_len=0,
              max_tokens=16, steps=4, model=REAL_MODEL),
    "l": Case("l: SmolLM2, matched, LoRA 16", hidden=576, layers=30, vocab=49_152, prompts=4, group=4, prompt_len=0,
              max_tokens=16, steps=4, model=REAL_MODEL, lora_rank=16),
    "d": Case("d: SmolLM2, defaults, full", hidden=576, layers=30, vocab=49_152, prompts=4, group=4, prompt_len=0,
              max_tokens=16, steps=5, model=REAL_MODEL, matched=False),
}  # fmt: skip
QUICK = {"a": dict(hidden=64, vocab=200, prompts=2, group=2, prompt_len=8, max_tokens=8, steps=2),
         "b": dict(hidden=64, vocab=200, prompts=2, group=2, prompt_len=8, max_tokens=8, steps=2),
         "c": dict(hidden=64, prompts=1, group=2, prompt_len=8, max_tokens=32, steps=2),
         "r": dict(prompts=1, group=2, max_tokens=4, steps=2),
         "l": dict(prompts=1, group=2, max_tokens=4, steps=2),
         "d": dict(prompts=1, group=2, max_tokens=4, steps=2)}  # fmt: skip
# head_dim = hidden // heads = 32 everywhere: vLLM's CPU attention rejects 16.


def toy_reward(prompts: list[str], completions: list[Any], **kwargs: Any) -> list[float]:
    """Dense toy reward (a checksum of the completion's text, mod 3, halved): random policies get mixed groups.

    It depends on the content, not only the length: completions that all run to ``max_tokens`` (case c) would
    otherwise score alike, every group would have zero advantage and lit_fgrpo would skip the training pass
    (``skip_zero_advantage``) while TRL still runs it: the step and its memory would not be comparable.
    """
    return [(zlib.crc32(str(c).encode()) % 3) / 2 for c in completions]


# ---------------------------------------------------------------- shared model and prompts
def prepare(case: Case, root: Path) -> Path:
    """Save a random Qwen2 model, a word-level tokenizer of ``case.vocab`` words and the prompt texts; return the
    model's folder (the real model's own folder when the case names one, with arithmetic questions as prompts)."""
    import torch

    if case.model is not None:
        folder = Path(__file__).resolve().parents[1] / case.model
        if not (folder / "config.json").is_file():
            sys.exit(f"error: {case.model} is not a model folder: run bash scripts/setup.sh (it imports SmolLM2)")
        g = torch.Generator().manual_seed(0)
        pairs = torch.randint(1, 21, (case.prompts * case.steps, 2), generator=g).tolist()
        texts = [f"What is {a} + {b}? Reply with just the number." for a, b in pairs]
        (root / "prompts.json").write_text(json.dumps(texts))
        return folder
    from transformers import AutoModelForCausalLM, Qwen2Config

    from lit_fgrpo.tasks.word_tokenizer import build_word_tokenizer

    words = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(4, case.vocab)]
    tokenizer = build_word_tokenizer(words)
    # apart from config.json: beside a qwen2 config, AutoTokenizer would load it as a Qwen2 (BPE) tokenizer
    tokenizer.save_pretrained(root / "tokenizer")
    config = Qwen2Config(
        vocab_size=case.vocab, hidden_size=case.hidden, intermediate_size=4 * case.hidden,
        num_hidden_layers=case.layers, num_attention_heads=case.hidden // 32, num_key_value_heads=case.hidden // 32,
        max_position_embeddings=case.prompt_len + case.max_tokens + 16, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(root)
    g = torch.Generator().manual_seed(0)
    n = case.prompts * case.steps
    ids = torch.randint(4, case.vocab, (n, case.prompt_len), generator=g).tolist()
    (root / "prompts.json").write_text(json.dumps([" ".join(f"w{i}" for i in row) for row in ids]))
    return root


# ---------------------------------------------------------------- contenders (each in its own process)
LIT_PHASES: list[dict[str, float]] = []
"""lit_fgrpo's ``time/*`` values of each step (its per-phase timers), filled by :func:`run_lit`."""


def run_lit(case: Case, root: Path, model: Path, clock: list[float], lengths: list[float]) -> None:
    """lit_fgrpo's step: FGRPOModule + RolloutCallback under a Lightning Trainer (the public API)."""
    import lightning as L
    from torch.utils.data import DataLoader

    from lit_fgrpo.callbacks import RolloutCallback
    from lit_fgrpo.data.datamodule import keep_batch
    from lit_fgrpo.data.records import PromptRecord
    from lit_fgrpo.engines.base import SamplingConfig
    from lit_fgrpo.models.lora import LoraSettings
    from lit_fgrpo.training.module import FGRPOModule
    from lit_fgrpo.training.module_settings import ObjectiveSettings, OptimizerSettings, PolicySettings

    tokenizer = str(model / "tokenizer") if case.model is None else str(model)
    lora = (
        LoraSettings(r=case.lora_rank, alpha=2 * case.lora_rank, target_modules=LORA_TARGETS)
        if case.lora_rank
        else None
    )
    module = FGRPOModule(
        policy=PolicySettings(model=str(model), tokenizer=tokenizer, lora=lora),
        objective=ObjectiveSettings(loss_type="grpo"),
        optimizer=OptimizerSettings(lr=1e-6),
    )
    texts = json.loads((root / "prompts.json").read_text())
    records = [PromptRecord(t, module.tokenizer(t)["input_ids"], {}, i) for i, t in enumerate(texts)]
    rollouts = RolloutCallback(
        engine="hf" if case.matched else "auto",
        decode_dtype=case.decode_dtype if case.matched else "float32",
        sampling=SamplingConfig(n=case.group, max_tokens=case.max_tokens, temperature=1.0, seed=0),
        reward_funcs=[toy_reward],  # type: ignore[list-item]
        validate_at_start=False,
        log_samples_every=0,
    )

    def read_phases(trainer: L.Trainer) -> None:
        # the module logs time/* in its on_train_batch_end, after the callbacks': read them one hook later
        values = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("time/")}
        if values:
            LIT_PHASES.append(values)

    class Clock(L.Callback):
        def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
            clock.append(time.perf_counter())
            read_phases(trainer)

        def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
            lengths.append(float(trainer.callback_metrics["rollout/completion_length"]))

        def on_train_end(self, trainer: L.Trainer, *args: Any) -> None:
            clock.append(time.perf_counter())
            read_phases(trainer)

    trainer = L.Trainer(
        max_steps=case.steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[Clock(), rollouts], accelerator="cpu", limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(module, DataLoader(records, batch_size=case.prompts, collate_fn=keep_batch))


def run_trl(case: Case, root: Path, model: Path, clock: list[float], lengths: list[float]) -> None:
    """TRL 1.16's GRPOTrainer on the same saved model and prompts."""
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    texts = json.loads((root / "prompts.json").read_text())
    matched: dict[str, Any] = dict(
        gradient_checkpointing=False, bf16=False, loss_type="grpo", beta=0.0, temperature=1.0, learning_rate=1e-6
    )
    args = GRPOConfig(
        output_dir=str(root / "trl_out"), per_device_train_batch_size=case.prompts * case.group,
        num_generations=case.group, max_completion_length=case.max_tokens, max_steps=case.steps, logging_steps=1,
        report_to="none", save_strategy="no", use_cpu=True, shuffle_dataset=False, **(matched if case.matched else {}),
    )  # fmt: skip

    class Clock(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            clock.append(time.perf_counter())

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

        def on_train_end(self, *args: Any, **kwargs: Any) -> None:
            clock.append(time.perf_counter())

    peft: dict[str, Any] = {}
    if case.lora_rank:
        from peft import LoraConfig

        peft["peft_config"] = LoraConfig(
            r=case.lora_rank, lora_alpha=2 * case.lora_rank, lora_dropout=0.0, target_modules=LORA_TARGETS
        )
    tokenizer = AutoTokenizer.from_pretrained(model / "tokenizer" if case.model is None else model)
    trainer = GRPOTrainer(
        model=str(model), reward_funcs=toy_reward, args=args, train_dataset=Dataset.from_dict({"prompt": texts}),
        processing_class=tokenizer, callbacks=[Clock()], **peft,
    )  # fmt: skip
    trainer.train()


FLOOR_PROBE = """
import os, sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
touched = sum(float(p.detach().sum()) for p in model.parameters())  # fault in every mmapped weight page
status = open(f"/proc/{os.getpid()}/status").read()
print(int(status.split("VmRSS:")[1].split()[0]) / 1024, sum(p.numel() for p in model.parameters()) * 4 / 2**20)
"""


def common_floor_mib(case: Case, model: Path) -> float:
    """What neither library's step can go below, measured in a fresh process: torch and transformers imported and
    the float32 weights resident; for full fine-tuning plus their gradients and AdamW's two moments (3x the weights;
    a LoRA adapter's share is left out)."""
    out = subprocess.run([sys.executable, "-c", FLOOR_PROBE, str(model)], capture_output=True, text=True, check=True)
    resident, weights = (float(x) for x in out.stdout.split())
    return resident + (0.0 if case.lora_rank else 3 * weights)


def current_rss_mib() -> float:
    """This process's resident memory now (``VmRSS``), MiB."""
    status = Path(f"/proc/{os.getpid()}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def worker(who: str, case: Case, root: Path, model: Path, threads: int, warmup: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # RSS after the library's own imports, before any model: Lightning pulls torchmetrics (and with it matplotlib,
    # scikit-learn and transformers' generation code) where TRL imports lazily
    if who == "lit":
        import lit_fgrpo.callbacks  # noqa: F401
        import lit_fgrpo.training.module  # noqa: F401
    else:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    imports_rss = current_rss_mib()
    clock: list[float] = []
    lengths: list[float] = []
    (run_lit if who == "lit" else run_trl)(case, root, model, clock, lengths)
    steps = [b - a for a, b in zip(clock, clock[1:])][warmup:]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kept = LIT_PHASES[warmup:]
    phases = {key: statistics.median(p.get(key, 0.0) for p in kept) for key in kept[0]} if kept else {}
    return {
        "phases": phases,
        "step_s": statistics.median(steps),
        "steps": steps,
        "completion_length": statistics.mean(lengths) if lengths else float("nan"),
        "peak_rss_mib": peak,
        "model_rss_mib": peak - base_rss,
        "imports_rss_mib": imports_rss,
        "threads_after": torch.get_num_threads(),
    }


# ---------------------------------------------------------------- driver
def run_case(case: Case, reps: int, threads: int, warmup: int) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {"lit": [], "trl": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = prepare(case, root)
        for rep in range(reps):
            for who in ("lit", "trl") if rep % 2 == 0 else ("trl", "lit"):
                out = root / f"{who}.json"
                cmd = [sys.executable, __file__, "--worker", who, "--case-json", json.dumps(asdict(case)),
                       "--root", str(root), "--model", str(model), "--threads", str(threads), "--warmup", str(warmup), "--out", str(out)]  # fmt: skip
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    sys.exit(f"{case.name}: the {who} worker failed:\n{proc.stderr[-3000:]}")
                results[who].append(json.loads(out.read_text()))
                r = results[who][-1]
                print(
                    f"  rep {rep + 1} {who}: step {r['step_s']:.3f} s, peak RSS {r['peak_rss_mib']:.0f} MiB", flush=True
                )
        results["floor"] = [{"floor_mib": common_floor_mib(case, model)}]  # measured alone, after the runs
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=["a", "b", "c"], choices=sorted(CASES))
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 repetition: a smoke test")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per contender (alternated)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads in both workers")
    parser.add_argument("--warmup", type=int, default=1, help="steps dropped at the start of each run")
    parser.add_argument(
        "--lit-decode-dtype",
        default="float32",
        choices=["float32", "bfloat16", "auto"],
        help="our decoding matmuls in the matched cases (--rollout.decode_dtype); TRL's stay float32",
    )
    parser.add_argument("--worker", choices=["lit", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--case-json", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        case = Case(**json.loads(args.case_json))
        result = worker(args.worker, case, Path(args.root), Path(args.model), args.threads, args.warmup)
        Path(args.out).write_text(json.dumps(result))
        return
    reps = 1 if args.quick else args.reps
    print(f"torch threads per worker: {args.threads}; repetitions: {reps}; load average: {os.getloadavg()[0]:.2f}")
    table = []
    for key in args.cases:
        case = replace(CASES[key], **QUICK[key]) if args.quick else CASES[key]
        case = replace(case, decode_dtype=args.lit_decode_dtype)
        print(
            f"{case.name}: decode {case.decode_dtype if case.matched else 'defaults'}; P={case.prompts} G={case.group} T={case.max_tokens} V={case.vocab} h={case.hidden}"
        )
        res = run_case(case, reps, args.threads, args.warmup)
        lit, trl = (statistics.median(r["step_s"] for r in res[w]) for w in ("lit", "trl"))
        rss = [statistics.median(r["peak_rss_mib"] for r in res[w]) for w in ("lit", "trl")]
        imports = [statistics.median(r["imports_rss_mib"] for r in res[w]) for w in ("lit", "trl")]
        floor = res["floor"][0]["floor_mib"]
        print(
            f"  RSS after the library imports: lit {imports[0]:.0f} MiB, TRL {imports[1]:.0f} MiB; the floor both "
            f"share (torch + transformers + the float32 weights"
            f"{'' if case.lora_rank else ' + gradients + AdamW moments'}): {floor:.0f} MiB; peak above it: "
            f"lit {rss[0] - floor:.0f} MiB, TRL {rss[1] - floor:.0f} MiB, ratio {(rss[0] - floor) / (rss[1] - floor):.2f}",
            flush=True,
        )
        lengths = [statistics.median(r["completion_length"] for r in res[w]) for w in ("lit", "trl")]
        table.append((case.name, lit, trl, rss, lengths))
        phases = res["lit"][-1]["phases"]
        if phases:
            print("  lit phases (last run, median step): " + ", ".join(f"{k[5:]} {v:.3g}" for k, v in phases.items()))
        if not any(run["phases"].get("time/forward") for run in res["lit"]):
            print("  WARNING: lit_fgrpo trained no row (every advantage was 0): the step is not comparable to TRL's")
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    head = f"{'case':<28} {'lit s':>7} {'TRL s':>7} {'lit/TRL':>7} {'RSS lit':>8} {'RSS TRL':>8} {'lit/TRL':>7} {'len lit':>7} {'len TRL':>7}"
    print(head + "\n" + "-" * len(head))
    for name, lit, trl, (r_lit, r_trl), (l_lit, l_trl) in table:
        print(
            f"{name:<28} {lit:>7.3f} {trl:>7.3f} {lit / trl:>7.2f} {r_lit:>7.0f}M {r_trl:>7.0f}M {r_lit / r_trl:>7.2f} "
            f"{l_lit:>7.1f} {l_trl:>7.1f}"
        )
    print("goals (issue #15): a <= 0.8, b <= 0.5 (step time), c <= 0.8 (peak RSS); real model (r, l): step <= 0.5,")
    print("peak RSS <= 0.3 of TRL's")


if __name__ == "__main__":
    main()
