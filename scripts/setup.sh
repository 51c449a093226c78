#!/usr/bin/env bash
# Set up a fresh checkout: a virtual environment in .venv with the project installed editable.
# torch is pinned through constraints.txt to the CPU build (a local wheel on these machines; an
# unpinned torch would pull a multi-GB CUDA build). No build isolation, so no second torch is fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade "pip>=23" "setuptools>=68" wheel
# extras: bench (pytest-benchmark), test (transformers, which the runtime's checkpoint tests compare
# with), text (tokenizers, for text prompts)
.venv/bin/python -m pip install -q -c constraints.txt -e ".[bench,test,text]" --no-build-isolation
.venv/bin/python -c "import torch, reference_impl, conformance; print('set-up ok: torch', torch.__version__)"
# The harness's pytest is the one in .venv: another pytest on PATH does not know --platform.
echo "use it with: source .venv/bin/activate (then pytest --platform=cpu), or .venv/bin/pytest --platform=cpu"
