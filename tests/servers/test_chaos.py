"""Issue 32 item 2: a seeded chaos run. Two real launched ``vllm serve`` processes; a small sample -> learn -> push ->
check loop runs once undisturbed and once while a seeded plan SIGKILLs or SIGSTOPs a server at chosen moments
(sampling, the push, the push's check). Both runs must sample the same tokens at every step and end with equal
weights. ``LIT_FGRPO_CHAOS_SEED`` replays a plan; the test prints every fault it injected and where.

Marked ``slow`` and ``chaos`` (about 6-10 minutes on 2 busy cores: two server starts and a restart per fault), so it
runs beside CI, not in it: ``LIT_FGRPO_CHAOS=1 .venv/bin/python -m pytest tests/servers/test_chaos.py -s``.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from lit_fgrpo.engines.base import Generation
from lit_fgrpo.servers.engine import ServerEngine
from lit_fgrpo.servers.fleet import Server
from tests.servers.test_engine import PROMPTS, SAMPLING, check, probe_of, tiny_policy
from tests.tiny_models import EOS, vllm_tokenizer

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.chaos]

SEED = int(os.environ.get("LIT_FGRPO_CHAOS_SEED", "30"))
STEPS = 4
FAULTS = 3
MOMENTS = ("sampling", "push", "check")
TEST_TIMEOUT_S = 1200


@pytest.fixture(autouse=True)
def _timeout() -> Iterator[None]:
    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"test exceeded {TEST_TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TEST_TIMEOUT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def plan(seed: int) -> dict[tuple[int, str], tuple[int, str]]:
    """(step, moment) -> (server index, signal name): ``FAULTS`` distinct moments of the run, seeded."""
    rng = random.Random(seed)
    moments = rng.sample([(step, moment) for step in range(STEPS) for moment in MOMENTS], FAULTS)
    return {m: (rng.randrange(2), rng.choice(["SIGKILL", "SIGSTOP"])) for m in sorted(moments)}


@contextlib.contextmanager
def fault_at(server: Server | None, signame: str, log: list[str], where: str) -> Iterator[None]:
    """Send ``signame`` to ``server``'s process group as its next request goes out (nothing when ``server`` is None)."""
    if server is None:
        yield
        return
    assert server.process is not None and server.process.process is not None
    pgid, send, fired = server.process.process.pid, server.client.post, [False]

    def post(path: str, body: dict[str, Any] | None = None, timeout_s: float | None = None) -> Any:
        if not fired[0]:
            fired[0] = True
            log.append(f"{signame} {server.url} at {where} ({path})")
            os.killpg(pgid, getattr(signal, signame))
        return send(path, body, timeout_s)

    server.client.post = post  # type: ignore[method-assign]
    try:
        yield
    finally:
        del server.client.post  # back to the class's method
        if not fired[0]:
            log.append(f"skipped at {where}: {server.url} got no request")


def learn(policy: nn.Module, prompts: list[list[int]], generation: Generation) -> None:
    """One SGD step on the sampled completions' negative log-likelihood (the samples decide the next weights)."""
    policy.train()
    n = len(generation.completion_ids) // len(prompts)
    loss = torch.zeros(())
    for row, completion in enumerate(generation.completion_ids):
        if not completion:
            continue
        prompt = prompts[row // n]
        ids = torch.tensor([prompt + list(completion)])  # (1, T)
        labels = ids.clone()
        labels[0, : len(prompt)] = -100
        loss = loss + policy(input_ids=ids, labels=labels).loss
    loss.backward()
    with torch.no_grad():
        for parameter in policy.parameters():
            if parameter.grad is not None:
                parameter.sub_(0.05 * parameter.grad)
                parameter.grad = None
    policy.eval()


def victim(
    engine: ServerEngine, faults: dict[tuple[int, str], tuple[int, str]], step: int, moment: str
) -> tuple[Server | None, str]:
    """The planned server and signal at this moment (another up server when the planned one is restarting)."""
    index, signame = faults.get((step, moment), (-1, ""))
    up = engine.fleet.up()
    if index < 0 or not up:
        return None, signame
    return (engine.fleet.servers[index] if engine.fleet.servers[index] in up else up[0]), signame


def run(engine: ServerEngine, faults: dict[tuple[int, str], tuple[int, str]], log: list[str]) -> tuple[Any, ...]:
    """The loop from fresh weights; each step's completions and the final weights."""
    policy = tiny_policy()
    engine.sync_weights(policy)
    samples = []
    for step in range(STEPS):
        seeds = [100 * step + 7 * i for i in range(len(PROMPTS))]

        with fault_at(*victim(engine, faults, step, "sampling"), log, f"step {step} sampling"):
            generation = engine.generate(PROMPTS, SAMPLING, seeds)
        samples.append(generation.completion_ids)
        learn(policy, PROMPTS, generation)
        with fault_at(*victim(engine, faults, step, "push"), log, f"step {step} push"):
            engine.sync_weights(policy)
        with fault_at(*victim(engine, faults, step, "check"), log, f"step {step} check"):
            assert check(engine, policy, *probe_of(generation, PROMPTS)) < 1e-3
    return samples, {k: v.clone() for k, v in policy.state_dict().items()}


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_seeded_faults_at_random_moments_change_no_sample_and_no_weight(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = ServerEngine.from_model(
        tiny_policy(),
        vllm_tokenizer(),
        tmp_path_factory.mktemp("chaos"),
        eos_token_id=EOS,
        launch=2,
        startup_timeout_s=240,
        restarts=FAULTS,
        control_timeout_s=20.0,
        request_timeout_s=30.0,
    )
    try:
        start = time.monotonic()
        calm_samples, calm_weights = run(engine, {}, [])
        calm_s = time.monotonic() - start
        faults, log = plan(SEED), list[str]()
        start = time.monotonic()
        samples, weights = run(engine, faults, log)
        chaos_s = time.monotonic() - start
    finally:
        engine.close()
    with capsys.disabled():
        print(
            f"\nchaos seed {SEED}: {len(log)} faults planned, undisturbed {calm_s:.1f} s, with faults {chaos_s:.1f} s"
        )
        for line in log:
            print(f"  {line}")
    assert sum(not line.startswith("skipped") for line in log) >= 1
    assert samples == calm_samples
    assert weights.keys() == calm_weights.keys()
    assert all(torch.equal(weights[k], calm_weights[k]) for k in weights)
