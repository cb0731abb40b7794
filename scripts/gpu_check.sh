#!/usr/bin/env bash
# The GPU check (issue 9): on one H200, within about 8-10 minutes,
#   1. the `gpu`-marked tests (CUDA HF engine, FSDP2 full-weight gather on CUDA/NCCL, vLLM where marked), among them
#      tests/rollout/test_server_collective_gpu.py (issue 23): a launched CUDA `vllm serve` (10% of the GPU) gets the
#      policy from cuda:0 over `push: collective` and passes the log-prob probe; gloo on one GPU, nccl only with two
#      (NCCL refuses two ranks on one device). Its server start-up (~1-2 min) is not yet measured on the H200,
#      hence the step's longer timeout,
#   2. benchmarks/gpu_step.py: bf16 policy updates of a randomly initialised ~0.5B Qwen2 built from a config,
#      vLLM colocated with sleep mode on; prints generate / log-probs / train / sync, tokens/s, MFU, peak memory,
#   3. a sharded step (issue 24): maze_tiny + the FSDP2 overlay on one GPU rank, bf16-true, `model_parallel`.
# Needs the CUDA extras: pip install -e '.[dev,vllm]'. Extra arguments go to gpu_step.py (e.g. --steps 6).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true TOKENIZERS_PARALLELISM=false
start=$SECONDS

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: torch sees no CUDA device (is the CPU wheel installed?)" >&2
    exit 2
fi
if ! "$PY" -c "import vllm" 2>/dev/null; then
    echo "gpu_check: vLLM is not installed: pip install -e '.[vllm]'" >&2
    exit 2
fi
"$PY" -c "import torch, vllm; print(f'torch {torch.__version__}, vLLM {vllm.__version__}, {torch.cuda.get_device_name()}')"

echo "== gpu-marked tests"
timeout 330 "$PY" -m pytest -p no:cacheprovider -q -m gpu tests

echo "== bf16 policy update, ~0.5B Qwen2, vLLM colocated (sleep mode)"
timeout 240 "$PY" benchmarks/gpu_step.py "$@"

echo "== sharded step: FSDP2 (model_parallel), one GPU rank, bf16-true, 3 RL steps of maze_tiny"
timeout 180 "$PY" -m lit_fgrpo fit --config configs/maze_tiny.yaml --config configs/maze/fsdp.yaml \
    --trainer.accelerator gpu --trainer.devices 1 --trainer.precision bf16-true --trainer.max_steps 3 \
    --trainer.logger false --trainer.enable_checkpointing false --trainer.limit_val_batches 0

echo "gpu_check: done in $((SECONDS - start)) s"
