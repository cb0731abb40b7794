#!/usr/bin/env bash
# Set up (if needed) and run the whole test command: ruff, mypy, pytest (notebooks included), then the
# rounding-sensitive tests (marker `numerics`) again on torch's and MKL's portable kernels, so that an expectation
# only this CPU meets fails here before it fails on another machine. Arguments go to the first pytest run only
# (given arguments, e.g. one test file, skip the second run). Both runs use 3 pytest-xdist workers, one
# test file per worker (module fixtures such as a launched vLLM server stay in one process): the tests pin torch
# to 1 thread and many wait on subprocesses, servers or files, so 2 workers kept the 2 cores ~65 % busy (user 26m54s
# over real 20m43s); 3 workers ran pytest in 15m54s instead of 20m10s on the same idle 2-core Xeon.
# PYTEST_WORKERS=0 runs them in this process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export MLFLOW_DISABLE_TELEMETRY=true HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
PARALLEL=(-n "${PYTEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder)  # longest files first: tests/conftest.py
SLOWEST=(--durations=60 --durations-min=15)  # the slowest tests, to keep the suite under 30 minutes
[ "${PYTEST_WORKERS:-3}" = 0 ] && PARALLEL=()
.venv/bin/python -m pytest -p no:cacheprovider "${PARALLEL[@]}" "${SLOWEST[@]}" "$@"
if [ "$#" -eq 0 ]; then
  echo "== numerics-sensitive tests again on the portable kernels (ATEN_CPU_CAPABILITY=default, MKL AVX2)"
  ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=AVX2 .venv/bin/python -m pytest -p no:cacheprovider "${PARALLEL[@]}" -m numerics
fi
