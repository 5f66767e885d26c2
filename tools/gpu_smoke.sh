#!/usr/bin/env bash
# The GPU smoke run (README, "Several processes, GPUs, vLLM"): grpo_qwen_gpu for 3 recorded steps on one GPU,
# under 10 minutes, printing per-stage seconds, peak GPU memory and the rollout/trainer log-prob gap.
#     tools/gpu_smoke.sh [--model DIR] [--steps 3] [--engine auto|vllm|hf] [--dry-run] [key=value ...]
# PYTHON picks the interpreter (default: .venv/bin/python if there, else python3). Without vllm the gpu extra is
# installed first; if that fails the run falls back to the hf engine and says so. --dry-run installs nothing and
# runs on a CPU: it prints the model config and the training command.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
dry=0
for a in "$@"; do [ "$a" = "--dry-run" ] && dry=1; done
if [ "$dry" = 0 ] && ! "$PYTHON" -c "import vllm, tensorboard" >/dev/null 2>&1; then
  echo "gpu_smoke: installing the gpu extra (vllm, tensorboard)"
  "$PYTHON" -m pip install -e ".[gpu]" || echo "gpu_smoke: could not install the gpu extra; the hf engine will be used" >&2
fi
exec timeout 600 "$PYTHON" tools/gpu_smoke.py "$@"
