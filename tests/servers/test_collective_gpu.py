"""``push: collective`` with the trainer's policy on ``cuda:0`` and a launched CUDA ``vllm serve`` (skipped without a
GPU; never faked). Run by ``scripts/gpu_check.sh`` (``-m gpu``).

``nccl``: the server on a second GPU, since NCCL refuses two ranks on one device ("Duplicate GPU detected"), so it
is skipped on a one-GPU machine. ``gloo``: the server on the trainer's GPU (a small ``--gpu-memory-utilization``),
the weights staged through host memory: the one-GPU way. Each push is checked with the run's own probe.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from lit_fgrpo.servers.engine import ServerEngine
from tests.servers.test_engine import PROMPTS, SAMPLING, SEEDS, check, probe_of, tiny_policy, train
from tests.tiny_models import EOS, vllm_tokenizer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.vllm,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (pip install -e '.[vllm]')"),
]

SERVER_ARGS = ("--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.1")
"""float32 like the trainer (the probe's 1e-3 is a float32 tolerance); eager and 10% of the GPU: a tiny model."""


@pytest.fixture(params=["nccl", "gloo"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "nccl" and torch.cuda.device_count() < 2:
        pytest.skip("nccl needs the server on another GPU than the trainer (NCCL: one rank per device)")
    return str(request.param)


@pytest.fixture
def policy() -> nn.Module:
    return tiny_policy().to("cuda:0")


@pytest.fixture
def engine(backend: str, policy: nn.Module, tmp_path: Path) -> Iterator[ServerEngine]:
    gpu = "1" if backend == "nccl" else "0"
    built = ServerEngine.from_model(
        policy,
        vllm_tokenizer(),
        tmp_path,
        eos_token_id=EOS,
        launch=1,
        startup_timeout_s=300,
        cpu_flags=False,
        extra_args=list(SERVER_ARGS),
        extra_env={"CUDA_VISIBLE_DEVICES": gpu},
        push="collective",
        push_backend=backend,
        push_timeout_s=60,
    )
    yield built
    built.close()


def test_a_collective_push_from_cuda_serves_the_policy(engine: ServerEngine, policy: nn.Module) -> None:
    probe = probe_of(engine.generate(PROMPTS, SAMPLING, SEEDS), PROMPTS)
    train(policy)  # on cuda:0
    engine.sync_weights(policy)
    metrics = engine.last_push_metrics()
    gap = check(engine, policy, *probe)
    print(f"{engine.settings.push_backend}: push {metrics['rollout/push_seconds']:.3f} s, gap {gap:.2e}")
    assert gap < 1e-3
