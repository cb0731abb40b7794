"""``lit-fgrpo plan``: the memory per rank of a ``fit`` config, before launch, without loading any weights.

    lit-fgrpo plan --config configs/maze_tiny.yaml --config configs/maze/fsdp.yaml --trainer.devices 2
    lit-fgrpo plan --config configs/math/base.yaml --config configs/math/fgrpo.yaml \\
        --architecture configs/math/qwen2.5-7b.json --gpu_memory_gib 80

The ``--config`` files (several stack, as for ``fit``) and ``--section.key`` overrides are parsed by ``fit``'s own
parser; nothing is instantiated. The policy is built on the meta device (shapes, no storage) from
``model.policy.model_config``, the ``config.json`` of the local ``model.policy.model`` directory, or ``--architecture FILE`` (an HF
``config.json``, for a model not downloaded yet), LoRA applied; the arithmetic is
:func:`lit_fgrpo.distributed.memory_plan.memory_plan`. A plan that exceeds ``--gpu_memory_gib`` is refused in one
line (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jsonargparse import Namespace

from lit_fgrpo.commands.cli_errors import precheck_config_files
from lit_fgrpo.commands.config_checks import as_plain
from lit_fgrpo.commands.lightning_cli import FGRPOCLI, cli_main
from lit_fgrpo.distributed.memory_plan import (
    GIB,
    EngineShare,
    MemoryPlan,
    PlanSettings,
    TensorShape,
    fits,
    memory_plan,
    vllm_share,
)
from lit_fgrpo.distributed.strategy import STRATEGY_NAME, check_strategy
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.models.lora import LoraSettings, apply_lora, lora_settings

_TWO_BYTES = ("bf16-true", "16-true")
_ENGINE_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


class _ParseOnly(FGRPOCLI):
    """``fit``'s parser and nothing else: no seed, no checks that build things, no instantiation."""

    def _set_seed(self) -> None:
        return

    def before_instantiate_classes(self) -> None:
        return

    def instantiate_classes(self) -> None:
        return

    def after_instantiate_classes(self) -> None:
        return


def parse_fit_config(words: list[str]) -> Namespace:
    """The ``fit`` config of ``--config`` files and overrides, parsed (and interpolated) as ``fit`` parses it."""
    precheck_config_files(words)
    with warnings.catch_warnings():  # "args and sys.argv both given": sys.argv holds `plan` and the plan's flags
        warnings.filterwarnings("ignore", message=".*not recommended to provide both args and command line")
        return cli_main(words, run=False, cli_class=_ParseOnly, parser_kwargs={"exit_on_error": False}).config


def architecture(model: Namespace, architecture_file: str | None) -> Any:
    """The policy's HF config: ``--architecture FILE``, else ``model_config``, else ``model``'s ``config.json``."""
    from transformers import AutoConfig

    from lit_fgrpo.models.policy import policy_config
    from lit_fgrpo.tasks.registry import load_tokenizer

    if architecture_file is not None:
        path = Path(architecture_file)
        if not path.is_file():
            raise ConfigError(f"--architecture {architecture_file}: no such file (an HF config.json)")
        return AutoConfig.for_model(**json.loads(path.read_text()))
    if model.get("model_config") is not None:
        return policy_config(as_plain(model.model_config), load_tokenizer(model.get("tokenizer") or model.model or ""))
    directory = Path(str(model.get("model") or ""))
    if not (directory / "config.json").is_file():
        raise ConfigError(
            f"--model.policy.model {model.get('model')}: no config.json there to read the architecture from; "
            "pass --architecture FILE (configs/math/qwen2.5-7b.json for the 7B presets)"
        )
    return AutoConfig.from_pretrained(directory)


def policy_shapes(config: Any, lora: LoraSettings | None) -> list[TensorShape]:
    """Every parameter tensor of the policy that ``config`` (and LoRA) builds, from a meta-device build."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        policy = AutoModelForCausalLM.from_config(config)
        if lora is not None:
            policy = apply_lora(policy, lora)
    return [
        TensorShape(p.shape[0] if p.dim() else 1, p[0].numel() if p.dim() else 1, p.requires_grad)
        for p in policy.parameters()
    ]


def world_size(trainer: Namespace) -> int:
    """``devices x num_nodes``; a device count the plan cannot know (``auto``) is one error naming the flag."""
    devices = trainer.get("devices", "auto")
    if isinstance(devices, list | tuple):
        count = len(devices)
    elif str(devices).lstrip("-").isdigit() and int(devices) > 0:
        count = int(devices)
    else:
        raise ConfigError(f"--trainer.devices {devices}: the plan needs a number of devices per node, e.g. 8")
    return count * int(trainer.get("num_nodes") or 1)


def strategy_name(strategy: Any) -> tuple[str, bool]:
    """The strategy's name (``model_parallel``, ``ddp``, ...) and whether it shards the reference."""
    check_strategy(strategy)
    value = as_plain(strategy)
    if isinstance(value, dict):
        sharding = as_plain((value.get("init_args") or {}).get("sharding")) or {}
        name = str(value.get("class_path", ""))
        sharded = name.endswith(("FSDP2Strategy", "ModelParallelStrategy"))
        return (STRATEGY_NAME if sharded else name), bool(sharding.get("shard_reference", True))
    return str(value), True


def engine_share(rollout: Namespace, accelerator: str, shapes: list[TensorShape], sharded: bool,
                 param_bytes: int, gpu_bytes: int) -> EngineShare | None:  # fmt: skip
    """The colocated engine's share of a rank's GPU (None when it takes nothing there)."""
    kind = str(rollout.get("engine") or "hf")
    base = sum(s.numel for s in shapes if not s.trainable) if any(not s.trainable for s in shapes) else 0
    full = sum(s.numel for s in shapes)
    weights = base if base and base < full else full  # with LoRA the engine holds the merged base weights
    if kind == "vllm" or (kind == "auto" and accelerator != "cpu"):
        kwargs = as_plain(rollout.get("engine_kwargs")) or {}
        dtype_bytes = _ENGINE_DTYPE_BYTES.get(str(kwargs.get("dtype", "bfloat16")), 2)
        utilization = float(kwargs.get("gpu_memory_utilization", 0.3))  # VLLMEngine's default
        kv = kwargs.get("kv_cache_memory_bytes")
        tp = int(kwargs.get("tensor_parallel_size", 1))
        return vllm_share(weights, dtype_bytes, gpu_bytes, utilization, None if kv is None else int(kv), tp)
    if kind == "hf_copy" or (kind == "hf" and sharded):
        copy = weights * param_bytes
        return EngineShare(copy, copy, f"HF engine's unsharded copy: {weights:,} x {param_bytes} B")
    return None  # hf samples with the policy itself; vllm_server runs elsewhere


@dataclass
class PlannedRun:
    """A config's plan and what it was made for."""

    plan: MemoryPlan
    """The lines per rank."""
    header: str
    """The run's layout in one line."""
    gpu_bytes: int
    """The declared memory of one GPU."""
    engine: EngineShare | None
    """The engine's share (None: nothing on the GPU)."""


def plan_run(argv: list[str]) -> PlannedRun:
    """The plan of ``argv`` (the plan's flags and ``fit``'s ``--config`` files and overrides)."""
    parser = argparse.ArgumentParser(prog="lit-fgrpo plan", exit_on_error=False, description=__doc__.split("\n")[0])
    parser.add_argument("--gpu_memory_gib", type=float, default=80.0, help="memory of one GPU, GiB (default 80)")
    parser.add_argument("--architecture", default=None, help="an HF config.json in place of the model's own")
    own, words = parser.parse_known_args(argv)
    if own.gpu_memory_gib <= 0:
        raise ConfigError(f"--gpu_memory_gib must be > 0, got {own.gpu_memory_gib}")
    config = parse_fit_config(words)
    model, trainer = config.model.policy, config.trainer
    lora = lora_settings(as_plain(model.get("lora")))
    shapes = policy_shapes(architecture(model, own.architecture), lora)
    world = world_size(trainer)
    name, shard_reference = strategy_name(trainer.get("strategy", "auto"))
    sharded = name == STRATEGY_NAME
    precision = str(trainer.get("precision") or "32-true")
    param_bytes = 2 if precision in _TWO_BYTES else 8 if precision.startswith("64") else 4
    reference = float(config.model.objective.get("beta") or 0.0) > 0 and lora is None
    settings = PlanSettings(world, sharded, world > 1 and not sharded, param_bytes, reference, shard_reference)
    gpu_bytes = int(own.gpu_memory_gib * GIB)
    accelerator = str(trainer.get("accelerator") or "auto")
    engine = engine_share(config.rollout, accelerator, shapes, sharded, param_bytes, gpu_bytes)
    nodes = int(trainer.get("num_nodes") or 1)
    layout = f"{world} ranks ({nodes} node{'s' if nodes > 1 else ''}), strategy {name}, precision {precision}"
    header = f"memory plan per rank: {layout}{', LoRA' if lora else ''}"
    return PlannedRun(memory_plan(shapes, settings, engine), header, gpu_bytes, engine)


def main(argv: list[str]) -> int:
    """Print the plan; a plan that does not fit ``--gpu_memory_gib`` raises one ``ConfigError`` line (exit 2)."""
    run = plan_run(argv)
    print(run.plan.render(run.header, run.gpu_bytes))
    problem = fits(run.plan, run.gpu_bytes, run.engine)
    if problem is not None:
        raise ConfigError(problem)
    return 0
