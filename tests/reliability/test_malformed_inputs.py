"""A corpus of malformed inputs across every subcommand: each is one ``error:`` line naming the culprit, exit 2.

Every case runs ``lit_fgrpo.cli.main`` in-process (no fresh interpreter) and asserts: status 2, no traceback, no
Union-subtype noise, exactly one ``error:`` line (plus at most one ``hint:``), and that line contains the strings
the case lists (the flag, the key, the file and line). The fit cases start from a one-step config with no logger, so
a case that is wrongly accepted costs a step, not a run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from lit_fgrpo.cli import main
from tests.reliability.test_cli_errors import TINY

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "evidence_tiny.csv"
ROLLOUT = "lit_fgrpo.callbacks.RolloutCallback"
NEEDS_VLLM = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
BAND_30_45 = '{"kind": "band", "low": 0.3, "high": 0.45}'
"""A band between 1/4 and 2/4: no group of 4 has a success rate inside it."""


def rollout(**settings: Any) -> list[str]:
    """``--rollout.*`` flags setting ``settings`` (``sampling`` by its fields, other values as JSON)."""
    words = []
    for key, value in settings.items():
        if key == "sampling":
            for field, inner in value.items():
                words += [f"--rollout.sampling.{field}", json.dumps(inner)]
        else:
            words += [f"--rollout.{key}", value if isinstance(value, str) else json.dumps(value)]
    return words


def write(folder: Path, name: str, text: str | bytes) -> str:
    path = folder / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def csv_lines(count: int | None = None, drop_column: str | None = None) -> str:
    lines = FIXTURE.read_text().splitlines()
    if drop_column is not None:
        index = lines[0].split(",").index(drop_column)
        lines = [",".join(c for i, c in enumerate(line.split(",")) if i != index) for line in lines]
    return "\n".join(lines[:count]) + "\n"


def servers(**options: Any) -> list[str]:
    """``--rollout.engine vllm_server`` with ``options`` as its engine_kwargs."""
    return ["--rollout.engine", "vllm_server", "--rollout.engine_kwargs", json.dumps(options)]


def busy_port() -> int:
    """A port that a listening socket of this process holds for the rest of the test session."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    _HELD.append(sock)
    return int(sock.getsockname()[1])


_HELD: list[socket.socket] = []


def policy_folder(d: Path, change: Callable[[Path], object] = lambda folder: None) -> list[str]:
    """Flags that load the policy from a Hugging Face folder of the tiny model (weights, config, tokenizer) saved in
    ``d``, after ``change(folder)`` broke it."""
    from transformers import AutoModelForCausalLM

    from lit_fgrpo.models.policy import policy_config
    from lit_fgrpo.tasks.registry import load_tokenizer

    folder = d / "policy"
    tokenizer = load_tokenizer("builtin:maze")
    AutoModelForCausalLM.from_config(policy_config(TINY["model"]["policy"]["model_config"], tokenizer)).save_pretrained(
        folder
    )
    tokenizer.save_pretrained(folder)
    change(folder)
    return [
        "--model.policy.model",
        str(folder),
        "--model.policy.model_config",
        "null",
        "--model.policy.tokenizer",
        "null",
    ]


def without_tokenizer(folder: Path) -> None:
    from lit_fgrpo.models.policy_checks import TOKENIZER_FILES

    for name in TOKENIZER_FILES:
        (folder / name).unlink(missing_ok=True)


def cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def as_shards(folder: Path) -> None:
    """The weights as an index of two shards, the second of which is missing."""
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


# Each case: (id, a function of the temporary folder giving the argv, strings the error line must contain).
Case = tuple[str, Callable[[Path], list[str]], list[str]]
SERVER_CASES: list[Case] = [
    ("servers_launch_negative", lambda d: servers(launch=-1), ["--rollout.engine_kwargs.launch", "-1"]),
    ("servers_launch_fraction", lambda d: servers(launch=1.5), ["--rollout.engine_kwargs.launch", "1.5"]),
    ("servers_none", lambda d: servers(), ["--rollout.engine_kwargs.launch", "--rollout.engine_kwargs.urls"]),
    ("servers_both", lambda d: servers(launch=1, urls=["http://127.0.0.1:1"]), ["launch=1", "urls"]),
    ("servers_unknown_key", lambda d: servers(launch=1, lauch_timeout=3), ["'lauch_timeout'", "startup_timeout_s"]),
    ("servers_cores_flat", lambda d: servers(launch=2, cores=[0, 1]), ["--rollout.engine_kwargs.cores", "[0, 1]"]),
    ("servers_cores_count", lambda d: servers(launch=2, cores=[[0]]), ["--rollout.engine_kwargs.cores", "launch=2"]),
    (
        "servers_cores_not_ours",
        lambda d: servers(launch=1, cores=[[max(os.sched_getaffinity(0)) + 1]]),
        ["--rollout.engine_kwargs.cores[0]", str(max(os.sched_getaffinity(0)) + 1), "cannot use"],
    ),
    ("servers_cores_negative", lambda d: servers(launch=1, cores=[[-1]]), ["--rollout.engine_kwargs.cores[0]", "-1"]),
    ("servers_ports_count", lambda d: servers(launch=2, ports=[8000]), ["--rollout.engine_kwargs.ports", "launch=2"]),
    ("servers_port_range", lambda d: servers(launch=1, ports=[70000]), ["--rollout.engine_kwargs.ports[0]", "70000"]),
    ("servers_port_twice", lambda d: servers(launch=2, ports=[8000, 8000]), ["--rollout.engine_kwargs.ports", "twice"]),
    (
        "servers_port_in_use",
        lambda d: servers(launch=1, ports=[busy_port()]),
        ["--rollout.engine_kwargs.ports[0]", "in use"],
    ),
    (
        "servers_host",
        lambda d: servers(launch=1, host="no.such.host.invalid"),
        ["--rollout.engine_kwargs.host", "no.such.host.invalid"],
    ),
    (
        "servers_url_scheme",
        lambda d: servers(urls=["localhost:8000"]),
        ["--rollout.engine_kwargs.urls[0]", "localhost:8000"],
    ),
    (
        "servers_url_path",
        lambda d: servers(urls=["http://127.0.0.1:8000/v1"]),
        ["--rollout.engine_kwargs.urls[0]", "/v1", "http://127.0.0.1:8000"],
    ),
    (
        "servers_max_model_len",
        lambda d: servers(launch=1, max_model_len=0),
        ["--rollout.engine_kwargs.max_model_len", "0"],
    ),
    ("servers_kv_cache", lambda d: servers(launch=1, kv_cache_gib=0), ["--rollout.engine_kwargs.kv_cache_gib", "0"]),
    (
        "servers_timeout",
        lambda d: servers(launch=1, startup_timeout_s="soon"),
        ["--rollout.engine_kwargs.startup_timeout_s", "'soon'"],
    ),
    (
        "servers_extra_env",
        lambda d: servers(launch=1, extra_env=["A=1"]),
        ["--rollout.engine_kwargs.extra_env", "A=1"],
    ),
]
"""The server group of ``--rollout.engine vllm_server``: refused before the policy is built, no server started."""

POLICY_FOLDER_CASES: list[Case] = [
    (
        "policy_folder_is_a_file",
        lambda d: policy_folder(d)[:1] + [str(d / "policy" / "config.json")] + policy_folder(d)[2:],
        ["--model.policy.model", "config.json", "is a file"],
    ),
    (
        "policy_no_config",
        lambda d: policy_folder(d, lambda f: (f / "config.json").unlink()),
        ["policy", "no config.json"],
    ),
    (
        "policy_config_not_json",
        lambda d: policy_folder(d, lambda f: (f / "config.json").write_text("{\n  model_type: llama}")),
        ["config.json:2", "not valid JSON"],
    ),
    (
        "policy_config_no_model_type",
        lambda d: policy_folder(d, lambda f: (f / "config.json").write_text("{}")),
        ["config.json", "no model_type"],
    ),
    (
        "policy_config_unknown_model_type",
        lambda d: policy_folder(d, lambda f: (f / "config.json").write_text('{"model_type": "nosuch"}')),
        ["config.json", "'nosuch'"],
    ),
    (
        "policy_no_weights",
        lambda d: policy_folder(d, lambda f: (f / "model.safetensors").unlink()),
        ["policy", "no weights", "model.safetensors"],
    ),
    (
        "policy_weights_truncated",
        lambda d: policy_folder(d, lambda f: cut_in_half(f / "model.safetensors")),
        ["model.safetensors", "truncated"],
    ),
    (
        "policy_weights_not_safetensors",
        lambda d: policy_folder(d, lambda f: (f / "model.safetensors").write_bytes(b"not a tensor file at all")),
        ["model.safetensors", "not a readable safetensors file"],
    ),
    (
        "policy_shard_missing",
        lambda d: policy_folder(d, as_shards),
        ["model.safetensors.index.json", "model-00002-of-00002.safetensors"],
    ),
    (
        "policy_tokenizer_not_json",
        lambda d: policy_folder(d, lambda f: (f / "tokenizer.json").write_text("{oops")),
        ["tokenizer.json:1", "not valid JSON"],
    ),
]
"""A ``--model.policy.model`` folder that is not a loadable model: one line naming the folder or the file."""

VLLM_CASES: list[Case] = [
    (
        "vllm_option_unknown",
        lambda d: ["--rollout.engine", "vllm", "--rollout.engine_kwargs", '{"max_model_lenght": 64}'],
        ["--rollout.engine_kwargs", "max_model_lenght", "EngineArgs"],
    ),
    (
        "vllm_memory_share",
        lambda d: ["--rollout.engine", "vllm", "--rollout.engine_kwargs", '{"gpu_memory_utilization": 1.5}'],
        ["--rollout.engine_kwargs.gpu_memory_utilization", "1.5"],
    ),
    (
        "vllm_max_model_len_zero",
        lambda d: ["--rollout.engine", "vllm", "--rollout.engine_kwargs", '{"max_model_len": 0}'],
        ["--rollout.engine_kwargs.max_model_len", "0"],
    ),
    (
        "vllm_max_model_len_too_long",
        lambda d: ["--rollout.engine", "vllm", "--rollout.engine_kwargs", '{"max_model_len": 100000}'],
        ["--rollout.engine_kwargs.max_model_len 100000", "max_position_embeddings 64"],
    ),
    (
        "vllm_max_model_len_below_the_prompts",
        lambda d: ["--rollout.engine", "vllm", "--rollout.engine_kwargs", '{"max_model_len": 8}'],
        ["--rollout.engine_kwargs.max_model_len 8 leaves no room to reply", "prompt has", "--data.max_prompt_length"],
    ),
]
"""Options of the colocated vLLM engine that vLLM refused deep in its start (refused before the engine starts)."""
MODEL_AND_TASK_CASES: list[Case] = [
    (
        "tokenizer_path_is_linked",
        lambda d: ["--data.tokenizer_path", str(d)],
        ["--data.tokenizer_path", "--model.policy.model"],
    ),
    (
        "model_folder_without_tokenizer",
        lambda d: policy_folder(d, without_tokenizer),
        ["policy", "no tokenizer in this folder"],
    ),
    (
        "arithmetic_operator",
        lambda d: ["--data.source", "arithmetic", "--data.arithmetic.operators", '["/"]'],
        ["--data.arithmetic.operators"],
    ),
    (
        "arithmetic_too_few_questions",
        lambda d: ["--data.source", "arithmetic", "--data.arithmetic.max_value", "3", "--data.splits.num_train", "50"],
        ["--data.splits.num_train", "exceeds the 9"],
    ),
]
"""Where the policy's tokenizer comes from and the arithmetic task's settings: the same for fit, validate and test."""

DATA_GROUP_CASES: list[Case] = [
    (
        "data_files_required",
        lambda d: ["--data.source", "parquet"],
        ["--data.files.train_path", "--data.source parquet"],
    ),
    (
        "data_files_answers",
        lambda d: ["--data.files.non_string_answers", "float"],
        ["--data.files.non_string_answers", "float"],
    ),
    ("data_maze_rows", lambda d: ["--data.maze.rows", "0"], ["--data.maze.rows must be >= 1, got 0"]),
    (
        "data_maze_one_cell",
        lambda d: ["--data.maze.rows", "1", "--data.maze.cols", "1"],
        ["--data.maze.rows x cols", "1x1"],
    ),
    ("data_maze_not_a_mapping", lambda d: ["--data.maze", "3"], ["--data.maze"]),
    ("data_gym_name", lambda d: ["--data.source", "reasoning_gym"], ["--data.reasoning_gym.name", "required"]),
    (
        "data_gym_size",
        lambda d: ["--data.reasoning_gym.dataset_size", "0"],
        ["--data.reasoning_gym.dataset_size must be >= 1, got 0"],
    ),
    ("data_splits_val_size", lambda d: ["--data.splits.val_size", "-1"], ["--data.splits.val_size must be >= 0"]),
    ("data_splits_text", lambda d: ["--data.splits.num_val", "x"], ["--data.splits.num_val", "x"]),
    ("data_prompts_length", lambda d: ["--data.prompts.max_length", "0"], ["--data.prompts.max_length must be >= 1"]),
    ("data_prompts_too_long", lambda d: ["--data.prompts.too_long", "wrap"], ["--data.prompts.too_long", "wrap"]),
    (
        "data_loader_prompts",
        lambda d: ["--data.loader.prompts_per_step", "0"],
        ["--data.loader.prompts_per_step must be >= 1, got 0"],
    ),
    (
        "data_loader_val",
        lambda d: ["--data.loader.val_batch_size", "0"],
        ["--data.loader.val_batch_size must be >= 1"],
    ),
    (
        "data_loader_workers",
        lambda d: ["--data.loader.num_workers", "-1"],
        ["--data.loader.num_workers must be >= 0"],
    ),
    ("data_flat_flag_of_before_the_groups", lambda d: ["--data.num_train", "5"], ["--data.num_train"]),
    (
        "data_config_flat_key",
        lambda d: ["--config", str(d / "tiny.yaml"), "--config", write(d, "f.yaml", "data:\n  num_train: 3\n")],
        ["f.yaml", "data.num_train"],
    ),  # fmt: skip
]
"""A wrong value in each of the data module's groups, and its flat settings of before the groups."""

FIT: list[Case] = [
    ("gamma_text", lambda d: ["--model.objective.gamma", "abc"], ["--model.objective.gamma", "abc"]),
    ("gamma_negative", lambda d: ["--model.objective.gamma", "-1"], ["--model.objective.gamma", "-1"]),
    ("lr_zero", lambda d: ["--model.optimizer.lr", "0"], ["--model.optimizer.lr"]),
    ("loss_type", lambda d: ["--model.objective.loss_type", "ppo"], ["--model.objective.loss_type", "ppo", "'grpo'"]),
    ("val_k_text", lambda d: ["--model.val_pass_at_k", "x"], ["--model.val_pass_at_k"]),
    ("val_k_zero", lambda d: ["--model.val_pass_at_k", "[0]"], ["--model.val_pass_at_k"]),
    ("group_weight_kind", lambda d: ["--model.objective.group_weight", '{"kind": "no_such_weight"}'], ["group_weight"]),
    (
        "band_reversed",
        lambda d: ["--model.objective.group_weight", '{"kind": "band", "low": 0.9, "high": 0.1}'],
        ["low=0.9"],
    ),
    ("max_steps_text", lambda d: ["--trainer.max_steps", "x"], ["--trainer.max_steps"]),
    ("precision", lambda d: ["--trainer.precision", "bf17"], ["--trainer.precision", "bf17"]),
    ("data_source", lambda d: ["--data.source", "csv"], ["--data.source", "csv"]),
    ("num_train_negative", lambda d: ["--data.splits.num_train", "-5"], ["--data.splits.num_train", "-5"]),
    (
        "train_path_missing",
        lambda d: ["--data.source", "jsonl", "--data.files.train_path", "no.jsonl"],
        ["--data.files.train_path", "no.jsonl"],
    ),
    *DATA_GROUP_CASES,
    *MODEL_AND_TASK_CASES,
    *SERVER_CASES,
    *POLICY_FOLDER_CASES,
    *VLLM_CASES,
    ("unknown_flag", lambda d: ["--model.no_such", "1"], ["--model.no_such"]),
    ("unknown_nested_flag", lambda d: ["--model.objective.no_such", "1"], ["--model.objective.no_such"]),
    ("flat_flag_of_before_the_groups", lambda d: ["--model.gamma", "1"], ["--model.gamma"]),  # hint: the new flag
    ("group_not_a_mapping", lambda d: ["--model.optimizer", "3"], ["--model.optimizer"]),
    ("group_steps_zero", lambda d: ["--model.batching.micro_batch_rows", "0"], ["--model.batching.micro_batch_rows"]),
    ("group_size_zero", lambda d: [*rollout(sampling={"n": 0})], ["rollout.sampling.n"]),
    ("max_tokens_zero", lambda d: [*rollout(sampling={"max_tokens": 0})], ["max_tokens"]),
    ("temperature_zero", lambda d: [*rollout(sampling={"temperature": 0})], ["temperature"]),
    ("reward_unknown", lambda d: [*rollout(reward_funcs=["nope"])], ["unknown reward 'nope'"]),
    ("reward_dotted", lambda d: [*rollout(reward_funcs=["no_mod:fn"])], ["no_mod:fn"]),
    ("reward_weights", lambda d: [*rollout(reward_weights=[1.0, 2.0])], ["reward_weights"]),
    ("engine_typo", lambda d: [*rollout(engine="vlm")], ["engine", "vlm"]),
    ("isolation_typo", lambda d: [*rollout(reward_isolation="fork")], ["reward_isolation"]),
    ("dynamic_rounds", lambda d: [*rollout(dynamic_sampling={"max_rounds": 0})], ["max_rounds"]),
    (
        "dynamic_oversample",
        lambda d: [*rollout(dynamic_sampling={"oversample": 0.5})],
        ["oversample"],
    ),
    (
        "val_samples_below_k",
        lambda d: [*rollout(val_samples=2), "--model.val_pass_at_k", "[1, 4]"],
        ["val_samples"],
    ),
    (
        "two_rollout_callbacks",
        lambda d: ["--trainer.callbacks", json.dumps([{"class_path": ROLLOUT}] * 2)],
        ["RolloutCallback", "trainer.callbacks"],
    ),
    (
        "engine_kwargs_for_hf",
        lambda d: [*rollout(engine="hf", engine_kwargs={"gpu_memory_utilization": 0.5})],
        ["engine_kwargs", "hf"],
    ),
    (
        "callback_class_typo",
        lambda d: ["--trainer.callbacks", json.dumps([{"class_path": "lit_fgrpo.callbacks.RolloutCallbak"}])],
        ["RolloutCallbak"],
    ),
    (
        "warm_start_lr",
        lambda d: [
            "--trainer.callbacks",
            json.dumps([{"class_path": "lit_fgrpo.callbacks.WarmStartCallback", "init_args": {"lr": -1}}]),
        ],
        ["lr"],
    ),  # fmt: skip
    (
        "tracking_uri",
        lambda d: [
            "--trainer.logger",
            json.dumps(
                {"class_path": "lightning.pytorch.loggers.MLFlowLogger", "init_args": {"tracking_uri": "mlflow.db"}}
            ),
        ],
        ["mlflow.db", "scheme"],
    ),  # fmt: skip
    ("max_steps_negative", lambda d: ["--trainer.max_steps", "-5"], ["max_steps", "-5"]),
    ("devices_text", lambda d: ["--trainer.devices", "x"], ["--trainer.devices"]),
    ("accelerator_typo", lambda d: ["--trainer.accelerator", "tpu9"], ["--trainer.accelerator", "tpu9"]),
    (
        "model_type_unknown",
        lambda d: ["--model.policy.model_config", '{"model_type": "nosuch"}'],
        ["model_type 'nosuch'"],
    ),
    (
        "model_heads_split_hidden",
        lambda d: [
            "--model.policy.model_config",
            '{"model_type": "llama", "hidden_size": 30, "num_attention_heads": 4}',
        ],
        ["--model.policy.model_config", "hidden_size 30", "num_attention_heads 4"],
    ),
    (
        "model_kv_heads_divide_heads",
        lambda d: [
            "--model.policy.model_config",
            '{"model_type": "llama", "hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 3}',
        ],
        ["--model.policy.model_config", "num_key_value_heads 3"],
    ),
    (
        "model_size_negative",
        lambda d: ["--model.policy.model_config", '{"model_type": "llama", "hidden_size": -16}'],
        ["--model.policy.model_config.hidden_size", "-16"],
    ),
    (
        "model_type_missing",
        lambda d: ["--model.policy.model_config", '{"hidden_size": 8}'],
        ["--model.policy.model_config"],
    ),
    (
        "tokenizer_missing",
        lambda d: ["--model.policy.tokenizer", "/no/such/dir"],
        ["--model.policy.tokenizer", "/no/such/dir"],
    ),
    ("seed_text", lambda d: ["--seed_everything", "x"], ["--seed_everything"]),
    ("callbacks_text", lambda d: ["--trainer.callbacks", "foo"], ["--trainer.callbacks", "foo"]),
    ("ckpt_missing", lambda d: ["--ckpt_path", str(d / "none.ckpt")], ["none.ckpt"]),
    ("ckpt_empty", lambda d: ["--ckpt_path", write(d, "e.ckpt", b"")], ["e.ckpt", "empty"]),
    ("config_list", lambda d: ["--config", write(d, "l.yaml", "- a\n- b\n")], ["l.yaml", "mapping"]),
    ("config_scalar", lambda d: ["--config", write(d, "s.yaml", "3\n")], ["s.yaml", "mapping"]),
    ("config_syntax", lambda d: ["--config", write(d, "y.yaml", "model: [1\n")], ["y.yaml:2"]),
    ("config_missing", lambda d: ["--config", str(d / "nope.yaml")], ["nope.yaml"]),
    ("lora_rank_zero", lambda d: ["--model.policy.lora", "{r: 0}"], ["--model.policy.lora.r", "0"]),
    ("lora_alpha_zero", lambda d: ["--model.policy.lora", "{alpha: 0}"], ["--model.policy.lora.alpha"]),
    (
        "lora_dropout_one",
        lambda d: ["--model.policy.lora", "{dropout: 1.0}"],
        ["--model.policy.lora.dropout", "[0, 1)"],
    ),
    (
        "lora_targets_empty",
        lambda d: ["--model.policy.lora", "{target_modules: []}"],
        ["--model.policy.lora.target_modules"],
    ),
    (
        "lora_targets_absent",
        lambda d: ["--model.policy.lora", "{target_modules: [nope]}"],
        ["--model.policy.lora.target_modules"],
    ),
    ("lora_field_unknown", lambda d: ["--model.policy.lora", "{rank: 4}"], ["--model.policy.lora", "rank"]),
    (
        "lora_yaml_mapping",
        lambda d: [
            "--config",
            write(
                d,
                "lora.yaml",
                yaml.safe_dump(dict(TINY, model={"policy": TINY["model"]["policy"] | {"lora": {"r": -2}}})),
            ),
        ],
        ["--model.policy.lora.r", "-2"],
    ),  # fmt: skip
    (
        "band_unreachable",
        lambda d: [
            "--model.objective.gamma",
            "0",
            "--model.objective.group_weight",
            BAND_30_45,
            *rollout(sampling={"n": 4}),
        ],
        ["--model.objective.group_weight", "--rollout.sampling.n=4", "every advantage"],
    ),  # fmt: skip
    (
        "band_unreachable_dynamic",
        lambda d: [
            "--model.objective.gamma",
            "0",
            "--model.objective.group_weight",
            BAND_30_45,
            *rollout(sampling={"n": 4}),
            *rollout(dynamic_sampling={"max_rounds": 2}),
        ],
        ["--rollout.sampling.n=4", "dynamic_sampling"],
    ),  # fmt: skip
    (
        "config_unknown_key",
        lambda d: ["--config", str(d / "tiny.yaml"), "--config", write(d, "k.yaml", "model:\n  nosuch: 1\n")],
        ["k.yaml", "model.nosuch"],
    ),  # fmt: skip
    (
        "config_unknown_nested_key",
        lambda d: [
            "--config",
            str(d / "tiny.yaml"),
            "--config",
            write(d, "n.yaml", "model:\n  objective:\n    gama: 1\n"),
        ],
        ["n.yaml", "model.objective.gama"],
    ),  # fmt: skip
]

SUBCOMMANDS: list[Case] = [
    ("report_truncated", lambda d: ["maze-report", write(d, "t.csv", FIXTURE.read_text()[:300])], ["t.csv:4"]),
    ("report_empty", lambda d: ["maze-report", write(d, "e.csv", "")], ["e.csv", "empty"]),
    (
        "report_no_column",
        lambda d: ["maze-report", write(d, "c.csv", csv_lines(drop_column="rl_steps"))],
        ["c.csv:1", "rl_steps"],
    ),  # fmt: skip
    (
        "report_no_metric",
        lambda d: ["maze-report", write(d, "m.csv", csv_lines(drop_column="dnll_rare"))],
        ["m.csv:1", "dnll_rare"],
    ),  # fmt: skip
    (
        "report_text_cell",
        lambda d: ["maze-report", write(d, "x.csv", csv_lines().replace(",200,", ",two hundred,", 1))],
        ["x.csv:", "must be a number"],
    ),  # fmt: skip
    ("report_step_absent", lambda d: ["maze-report", str(FIXTURE), "--rl_steps", "7"], ["--rl_steps 7", "100, 200"]),
    ("report_step_text", lambda d: ["maze-report", str(FIXTURE), "--rl_steps", "x"], ["--rl_steps"]),
    ("report_missing", lambda d: ["maze-report", str(d / "none")], ["none"]),
    ("report_dir_empty", lambda d: ["maze-report", str(d)], ["no seed*/maze_sweep.csv"]),
    ("compare_truncated", lambda d: ["maze-compare", write(d, "t.csv", FIXTURE.read_text()[:300])], ["t.csv:4"]),
    (
        "compare_no_base",
        lambda d: ["maze-compare", write(d, "b.csv", csv_lines(drop_column="base_pass_at_1"))],
        ["base_pass_at_1"],
    ),  # fmt: skip
    ("compare_step_absent", lambda d: ["maze-compare", str(FIXTURE), "--rl_steps", "3"], ["--rl_steps 3"]),
    ("compare_no_source", lambda d: ["maze-compare"], ["source"]),
    (
        "simulate_correct_gt_actions",
        lambda d: ["simulate", "--num-correct", "20", "--num-actions", "10"],
        ["--num-correct"],
    ),  # fmt: skip
    ("simulate_gamma_negative", lambda d: ["simulate", "--gammas", "-1"], ["--gammas"]),
    ("simulate_group_size_1", lambda d: ["simulate", "--group-sizes", "1"], ["--group-sizes"]),
    ("simulate_seeds_text", lambda d: ["simulate", "--seeds", "x"], ["--seeds"]),
    ("simulate_lr_zero", lambda d: ["simulate", "--lr", "0"], ["--lr"]),
    ("simulate_surrogate", lambda d: ["simulate", "--surrogate", "cubic"], ["--surrogate"]),
    ("simulate_uri", lambda d: ["simulate", "--mlflow", "--tracking-uri", "runs"], ["--tracking-uri", "'runs'"]),
    ("sweep_arms_text", lambda d: ["maze-sweep", "--arms", "[8-0.5]", "--out_dir", str(d / "o")], ["--arms", "8-0.5"]),
    ("sweep_arms_n1", lambda d: ["maze-sweep", "--arms", "[1:0]", "--out_dir", str(d / "o")], ["--arms", "1:0"]),
    ("sweep_arms_gamma", lambda d: ["maze-sweep", "--arms", "[8:-1]", "--out_dir", str(d / "o")], ["--arms", "8:-1"]),
    (
        "sweep_arms_method",
        lambda d: ["maze-sweep", "--arms", "[8:0:ppo]", "--out_dir", str(d / "o")],
        ["--arms", "ppo"],
    ),
    (
        "sweep_config_arms_numbers",
        lambda d: ["maze-sweep", "--config", write(d, "a.yaml", "arms: [8:0, 8:0.5]\n")],
        ["a.yaml", "480"],
    ),  # fmt: skip
    ("sweep_config_list", lambda d: ["maze-sweep", "--config", write(d, "l.yaml", "- 1\n")], ["l.yaml", "mapping"]),
    (
        "sweep_ks_gt_samples",
        lambda d: ["maze-sweep", "--ks", "[1, 512]", "--eval_samples", "8", "--out_dir", str(d / "o")],
        ["--ks"],
    ),  # fmt: skip
    (
        "sweep_uri",
        lambda d: ["maze-sweep", "--tracking_uri", "mlflow.db", "--out_dir", str(d / "o")],
        ["--tracking_uri"],
    ),  # fmt: skip
    (
        "sweep_group_size_1",
        lambda d: ["maze-sweep", "--group_sizes", "[1]", "--out_dir", str(d / "o")],
        ["--group_sizes"],
    ),
    ("sweep_gamma_negative", lambda d: ["maze-sweep", "--gammas", "[-1]", "--out_dir", str(d / "o")], ["--gammas"]),
    ("sweep_accelerator", lambda d: ["maze-sweep", "--accelerator", "tpu9", "--out_dir", str(d / "o")], ["tpu9"]),
    (
        "sweep_top_fraction",
        lambda d: ["maze-sweep", "--dnll_top_fraction", "2", "--out_dir", str(d / "o")],
        ["--dnll_top_fraction"],
    ),
    (
        "sweep_prompts_zero",
        lambda d: ["maze-sweep", "--prompts_per_step", "0", "--out_dir", str(d / "o")],
        ["--prompts"],
    ),
    (
        "sweep_lr_negative",
        lambda d: ["maze-sweep", "--warm_start_lr", "-1", "--out_dir", str(d / "o")],
        ["--warm_start_lr"],
    ),
    (
        "sweep_time_negative",
        lambda d: ["maze-sweep", "--time_budget_s", "-1", "--out_dir", str(d / "o")],
        ["--time_budget_s"],
    ),
    ("sweep_unknown_flag", lambda d: ["maze-sweep", "--no_such", "1"], ["--no_such"]),
    ("sweep_rl_steps_text", lambda d: ["maze-sweep", "--rl_steps", "x"], ["--rl_steps"]),
]

EVALUATE: list[Case] = [
    ("gamma_text", lambda d: ["--model.objective.gamma", "abc"], ["--model.objective.gamma", "abc"]),
    *MODEL_AND_TASK_CASES,
    ("unknown_flag", lambda d: ["--model.no_such", "1"], ["--model.no_such"]),
    (
        "config_unknown_key",
        lambda d: ["--config", write(d, "k.yaml", "model:\n  nosuch: 1\n")],
        ["k.yaml", "model.nosuch"],
    ),
    (
        "config_bad_value",
        lambda d: ["--config", write(d, "v.yaml", "model:\n  objective:\n    gamma: abc\n")],
        ["--model.objective.gamma", "abc"],
    ),
    ("config_syntax", lambda d: ["--config", write(d, "y.yaml", "model: [1\n")], ["y.yaml:2"]),
    ("ckpt_missing", lambda d: ["--ckpt_path", "missing.ckpt"], ["missing.ckpt"]),
    ("ckpt_empty", lambda d: ["--ckpt_path", write(d, "e.ckpt", b"")], ["e.ckpt", "empty"]),
    ("ckpt_garbage", lambda d: ["--ckpt_path", write(d, "g.ckpt", b"garbage")], ["g.ckpt", "not a readable"]),
    ("ckpt_last_none", lambda d: ["--ckpt_path", "last"], ["--ckpt_path last", "no checkpoint"]),
    ("val_k_above_samples", lambda d: ["--model.val_pass_at_k", "[1, 64]"], ["val_samples", "64"]),
    ("lora_rank_zero", lambda d: ["--model.policy.lora", "{r: 0}"], ["--model.policy.lora.r"]),
    ("group_size_zero", lambda d: [*rollout(sampling={"n": 0})], ["rollout.sampling.n"]),
    ("num_test_negative", lambda d: ["--data.splits.num_test", "-1"], ["--data.splits.num_test"]),
    ("limit_batches_text", lambda d: ["--trainer.limit_val_batches", "x"], ["--trainer.limit_val_batches"]),
]
"""The same mistakes given to ``validate`` and ``test`` (LightningCLI's evaluation subcommands)."""


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # anything a command writes stays in tmp_path
    monkeypatch.delenv("LIT_FGRPO_DEBUG", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    return tmp_path


def assert_one_line(argv: list[str], must_name: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2, err[-2000:]
    assert "Traceback" not in err and "Union subtypes" not in err, err[-2000:]
    errors = [line for line in err.splitlines() if "error: " in line]
    hints = [line for line in err.splitlines() if line.startswith("hint: ")]
    assert len(errors) == 1 and len(hints) <= 1, err[-2000:]
    for name in must_name:
        assert name in errors[0], f"{name!r} not in {errors[0]!r}"


FIT_PARAMS = [pytest.param(*c[1:], id=c[0], marks=[NEEDS_VLLM] if c in VLLM_CASES else []) for c in FIT]


@pytest.mark.parametrize(("argv", "must_name"), FIT_PARAMS)
def test_fit(folder: Path, capsys: pytest.CaptureFixture[str], argv: Callable[[Path], list[str]], must_name: list[str]) -> None:  # fmt: skip
    words = argv(folder)
    config = [] if "--config" in words else ["--config", str(folder / "tiny.yaml")]
    assert_one_line(["fit", *config, *words], must_name, capsys)


@pytest.mark.parametrize("subcommand", ["validate", "test"])
@pytest.mark.parametrize(("argv", "must_name"), [c[1:] for c in EVALUATE], ids=[c[0] for c in EVALUATE])
def test_evaluate(
    folder: Path,
    capsys: pytest.CaptureFixture[str],
    subcommand: str,
    argv: Callable[[Path], list[str]],
    must_name: list[str],
) -> None:
    assert_one_line([subcommand, "--config", str(folder / "tiny.yaml"), *argv(folder)], must_name, capsys)


def test_evaluate_hint_names_its_subcommand(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["test", "--config", str(folder / "tiny.yaml"), "--model.objective.gamma", "x"]) == 2
    assert "`lit-fgrpo test --help`" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "must_name"), [c[1:] for c in SUBCOMMANDS], ids=[c[0] for c in SUBCOMMANDS])
def test_subcommand(
    folder: Path, capsys: pytest.CaptureFixture[str], argv: Callable[[Path], list[str]], must_name: list[str]
) -> None:
    words = argv(folder)
    assert_one_line(words, must_name, capsys)
    assert not list(folder.rglob("*.tmp")), "a half-written file was left behind"
    assert not (folder / "o" / "sweep_config.json").exists(), "a refused sweep wrote its settings"


def test_mlflow_tracking_uri_from_the_environment(
    folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "mlflow.db")
    config = dict(TINY, trainer={k: v for k, v in TINY["trainer"].items() if k != "logger"})
    (folder / "logged.yaml").write_text(yaml.safe_dump(config))
    assert_one_line(["fit", "--config", str(folder / "logged.yaml")], ["MLFLOW_TRACKING_URI", "mlflow.db"], capsys)


@pytest.mark.parametrize(
    ("words", "group"),
    [
        (["--data.num_train", "5"], "--data.splits.num_train (data: {splits: ...})"),
        (["--data.maze_rows", "5"], "--data.maze.rows (data: {maze: ...})"),
        (["--config", "f.yaml"], "--data.prompts.max_length (data: {prompts: ...})"),
    ],
    ids=["flag", "renamed_flag", "config_key"],
)
def test_flat_data_setting_hints_its_group(
    folder: Path, capsys: pytest.CaptureFixture[str], words: list[str], group: str
) -> None:
    write(folder, "f.yaml", "data:\n  max_prompt_length: 64\n")
    assert main(["fit", "--config", str(folder / "tiny.yaml"), *words]) == 2
    hints = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hint: ")]
    assert hints == [f"hint: the data module's settings are grouped: use {group}"]
