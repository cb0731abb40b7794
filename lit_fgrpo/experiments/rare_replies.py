"""``lit-fgrpo rare-nll``: ΔNLL_rare (paper App. M.2) on a real model, for every finished run of a comparison.

The base model answers each training question of the comparison's fit config ``samples`` times (the colocated
vLLM engine, temperature 1, the runs' reply length); its correct replies (the task's answer check) are scored by
their length-normalised NLL under the base, and each run's saved policy (``<run>/policy``, the LoRA merged) scores
the same replies. ΔNLL_rare is the mean NLL increase of the ``top_fraction`` of correct replies the base found
least likely (:func:`~lit_fgrpo.theory.dnll_rare.delta_nll_rare`): positive when training moved probability away
from the rare correct replies, the sharpening F-GRPO is meant to limit. Per arm: the mean over seeds with its 95 % t
interval, and each arm's paired difference to the baseline. Writes ``<out_dir>/rare_nll.json``, which the compare
report shows::

    lit-fgrpo rare-nll --config configs/compare/smollm2_power.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import yaml

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.experiments.compare_runs import RESULTS, CompareSettings, load_settings, run_dir
from lit_fgrpo.experiments.evidence_stats import paired
from lit_fgrpo.experiments.rare_pool import RarePool, pack_pool, score_nll
from lit_fgrpo.theory.dnll_rare import rare_indices

OUT_FILE = "rare_nll.json"


def fit_setting(settings: CompareSettings, *path: str) -> Any:
    """A value of the comparison's fit configs (the last config that sets it wins), None if none sets it."""
    value = None
    for config in settings.fit_configs:
        node: Any = yaml.safe_load(Path(config).read_text()) or {}
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            value = node
    return value


def training_questions(settings: CompareSettings) -> tuple[list[str], list[str]]:
    """The fit config's arithmetic training questions and their answers (the data module's split, seed 0)."""
    from lit_fgrpo.tasks.arithmetic import ArithmeticSettings
    from lit_fgrpo.tasks.builtin import arithmetic_prompts

    if fit_setting(settings, "data", "source") != "arithmetic":
        raise ConfigError("rare-nll: the fit configs must train on --data.source arithmetic")
    task = ArithmeticSettings(**(fit_setting(settings, "data", "arithmetic") or {}))
    sizes = fit_setting(settings, "data", "splits") or {}
    splits = arithmetic_prompts(task, sizes["num_train"], sizes["num_val"], sizes.get("num_test", 0),
                                int(fit_setting(settings, "data", "seed") or 0))  # fmt: skip
    return [p.question for p in splits["train"]], [p.columns["answer"] for p in splits["train"]]


def sample_pool(base: str, questions: list[str], answers: list[str], samples: int, max_tokens: int) -> RarePool:
    """The base model's correct replies to ``questions`` (``samples`` each) with their base NLL.

    Sampled on the runs' own engine (:class:`~lit_fgrpo.engines.vllm_engine.VLLMEngine`, in process, seed 0), scored
    by the task's reward (``last_number``); duplicates are kept, as in the paper's protocol."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_fgrpo.data.records import render_prompt
    from lit_fgrpo.engines.base import SamplingConfig
    from lit_fgrpo.engines.vllm_engine import VLLMEngine
    from lit_fgrpo.rewards.last_number import last_number_reward

    tokenizer = AutoTokenizer.from_pretrained(base)
    prompts = [tokenizer(render_prompt(tokenizer, q), add_special_tokens=False)["input_ids"] for q in questions]
    engine = VLLMEngine(base, tokenizer.eos_token_id, max_model_len=128, in_process=True)
    try:
        generation = engine.generate(prompts, SamplingConfig(n=samples, temperature=1.0, max_tokens=max_tokens, seed=0))
    finally:
        engine.close()
    texts = tokenizer.batch_decode(generation.completion_ids, skip_special_tokens=True)
    rewards = last_number_reward([""] * len(texts), texts, answer=[a for a in answers for _ in range(samples)])
    pairs = [(prompts[row // samples], ids) for row, (ids, r) in enumerate(zip(generation.completion_ids, rewards,
             strict=True)) if r == 1.0]  # fmt: skip
    input_ids, attention_mask, completion_mask = pack_pool(pairs, int(tokenizer.pad_token_id or 0))
    pool = RarePool(input_ids, attention_mask, completion_mask, torch.zeros(len(pairs)), len(questions) * samples)
    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32).eval()
    pool.base_nll = score_nll(model, pool)
    return pool


def rare_part(pool: RarePool, top_fraction: float) -> RarePool:
    """The pool's ``top_fraction`` rows of highest base NLL (:func:`~lit_fgrpo.theory.dnll_rare.rare_indices`): only
    they enter ΔNLL_rare, so a trained policy scores only them (a tenth of the forward passes at 0.1)."""
    rows = rare_indices(pool.base_nll, top_fraction)  # (k,)
    return RarePool(pool.input_ids[rows], pool.attention_mask[rows], pool.completion_mask[rows], pool.base_nll[rows],
                    pool.num_sampled)  # fmt: skip


def measure(settings: CompareSettings, pool: RarePool, top_fraction: float) -> dict[str, Any]:
    """ΔNLL_rare of each finished run with a saved policy, per arm and seed: the mean over the rare replies of
    (NLL under the run's policy - NLL under the base), as :func:`~lit_fgrpo.theory.dnll_rare.delta_nll_rare`."""
    from transformers import AutoModelForCausalLM

    rare = rare_part(pool, top_fraction)
    runs: dict[str, dict[int, dict[str, float]]] = {arm: {} for arm in settings.arms}
    for arm in settings.arms:
        for seed in settings.seeds:
            folder = run_dir(settings, seed, arm)
            if not (folder / RESULTS).is_file() or not (folder / "policy" / "config.json").is_file():
                continue
            model = AutoModelForCausalLM.from_pretrained(folder / "policy", torch_dtype=torch.float32).eval()
            trained = score_nll(model, rare)  # (k,)
            value = float((trained.double() - rare.base_nll.double()).mean())
            runs[arm][seed] = {"dnll_rare": value}
            print(f"rare-nll: seed {seed} {arm}: dNLL_rare {value:+.3f}", flush=True)
    base = runs[settings.baseline] if settings.baseline is not None else {}  # None: a pilot, no comparison
    summary = {arm: asdict(paired([r["dnll_rare"] for r in per.values()])) for arm, per in runs.items()}
    tests = {
        f"{arm} - {settings.baseline}": asdict(paired([per[s]["dnll_rare"] - base[s]["dnll_rare"]
                                                       for s in sorted(per.keys() & base.keys())]))
        for arm, per in runs.items() if settings.baseline is not None and arm != settings.baseline
    }  # fmt: skip
    return {"pool": {"correct": len(pool), "rare": len(rare), "sampled": pool.num_sampled, "top_fraction": top_fraction},
            "runs": {arm: {str(s): v for s, v in per.items()} for arm, per in runs.items()},
            "summary": summary, "tests": tests}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """``lit-fgrpo rare-nll --config COMPARE.yaml [--samples N] [--top-fraction F] [--max-tokens T]``."""
    parser = argparse.ArgumentParser(prog="lit-fgrpo rare-nll", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the compare settings (YAML) whose runs are scored")
    parser.add_argument("--samples", type=int, default=32, help="base-model replies per training question")
    parser.add_argument("--top-fraction", type=float, default=0.1, help="share of correct replies counted as rare")
    parser.add_argument("--max-tokens", type=int, default=None, help="reply length (default: the fit config's)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    settings = load_settings(args.config)
    if args.samples < 1 or not 0 < args.top_fraction <= 1:
        raise ConfigError("rare-nll: --samples must be >= 1 and --top-fraction in (0, 1]")
    questions, answers = training_questions(settings)
    max_tokens = args.max_tokens or int(fit_setting(settings, "rollout", "sampling", "max_tokens") or 8)
    base = str(fit_setting(settings, "model", "policy", "model"))
    pool = sample_pool(base, questions, answers, args.samples, max_tokens)
    print(f"rare-nll: {len(pool)} correct replies of {pool.num_sampled} sampled from {base}", flush=True)
    result = measure(settings, pool, args.top_fraction)
    out = Path(settings.out_dir) / OUT_FILE
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"rare-nll: written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
