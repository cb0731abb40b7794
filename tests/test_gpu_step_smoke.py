"""benchmarks/gpu_step.py's CPU smoke run: the GPU benchmark's code path (module, data module, rollout callback,
phase timer) on a tiny Qwen2, so that an API change breaks here rather than on the one GPU session that runs it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_step_cpu_smoke_times_every_phase(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("gpu_step", ROOT / "benchmarks" / "gpu_step.py")
    assert spec is not None and spec.loader is not None
    gpu_step = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_step)

    assert gpu_step.main(["--cpu-smoke"]) == 0
    out = capsys.readouterr().out
    assert "median over 1 step(s) after the warm-up step" in out
    for phase in ("generate", "log-probs", "train", "sync", "total", "tokens/s"):
        assert f"\n  {phase} " in out, phase
