#!/usr/bin/env bash
# Check the project on a CUDA machine that already has torch (no network needed): install it in
# place over the machine's torch, build the CUDA kernels, run the conformance harness on the cuda
# platform, the project's tests and the GPU kernel benchmark. Prints one line per step (ok/FAILED,
# time, verdict, test counts) and exits non-zero if any step failed; full logs go to LOG_DIR.
#
#   scripts/gpu-check.sh [LOG_DIR]        (default: gpu-check-logs/<UTC time>)
#   PYTHON=/path/to/python JOBS=8 scripts/gpu-check.sh
#   STEPS="build conformance" scripts/gpu-check.sh     (a subset of: install build conformance tests bench)
#
# PYTHON (default python3) must see a CUDA build of torch and a GPU. If it runs inside a virtual
# environment the project is installed there; otherwise into .venv-gpu, created with
# --system-site-packages so the machine's torch, triton and test tools are used as they are.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-8}
STEPS=${STEPS:-install build conformance tests bench}

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "gpu-check: refused, no CUDA here: PYTHON=$PYTHON is not an executable" >&2
  exit 2
fi

refusal=$("$PYTHON" - 2>&1 <<'EOF'
import sys
try:
    import torch
except Exception as exc:
    sys.exit(f"torch cannot be imported ({type(exc).__name__})")
if torch.version.cuda is None:
    sys.exit(f"torch {torch.__version__} is not a CUDA build")
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device")
EOF
)
if [ $? -ne 0 ]; then
  echo "gpu-check: refused, no CUDA here for ${PYTHON}: ${refusal:-$PYTHON cannot run}" >&2
  exit 2
fi

LOG_DIR=${1:-gpu-check-logs/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$LOG_DIR"
LOG_DIR=$(cd "$LOG_DIR" && pwd)
unset TRITON_INTERPRET REFERENCE_IMPL_PLUGINS
SUMMARY=()
FAILED=0

# step NAME DETAIL-FUNCTION COMMAND...: runs COMMAND with output to LOG_DIR/NAME.log, records a line.
step() {
  local name=$1 detail=$2 start rc extra=""
  shift 2
  start=$(date +%s)
  echo "gpu-check: ${name} ..." >&2
  "$@" >"$LOG_DIR/$name.log" 2>&1
  rc=$?
  [ "$detail" != "-" ] && extra=$($detail)
  if [ $rc -eq 0 ]; then
    SUMMARY+=("$(printf '%-12s ok      %5ss  %s' "$name" "$(($(date +%s) - start))" "$extra")")
  else
    FAILED=1
    SUMMARY+=("$(printf '%-12s FAILED  %5ss  %s (exit %s, see %s.log)' "$name" "$(($(date +%s) - start))" \
      "$extra" "$rc" "$name")")
  fi
  return $rc
}

if "$PYTHON" -c 'import sys; sys.exit(0 if sys.prefix != sys.base_prefix else 1)'; then
  PY=$PYTHON
else
  PY=$PWD/.venv-gpu/bin/python
fi

install() {
  if [ "$PY" != "$PYTHON" ] && [ ! -x "$PY" ]; then
    "$PYTHON" -m venv --system-site-packages .venv-gpu || return 1
  fi
  "$PY" -m pip install --no-deps --no-build-isolation -e . || return 1
  # --no-deps: what the project needs must already be on the machine; name what is missing.
  "$PY" - <<'EOF'
import importlib.util, sys
need = ["torch", "triton", "pytest", "xdist", "pytest_timeout", "hypothesis", "tabulate", "numpy", "ninja"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing on this machine (install them; --no-deps installs none): {', '.join(missing)}")
import reference_impl, conformance, torch
print(f"installed over torch {torch.__version__} (CUDA {torch.version.cuda}), {torch.cuda.get_device_name(0)}")
EOF
}
install_detail() { tail -n 1 "$LOG_DIR/install.log"; }

build() {
  local arch
  arch=$("$PY" -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())') || return 1
  "$PY" -m reference_impl.kernels._build_cuda --arch "$arch" --binding || return 1
  "$PY" -c 'from reference_impl.kernels import _build_cuda; _build_cuda.load(); print("reference_cuda loaded")'
}
build_detail() { grep -m1 '^compiled ' "$LOG_DIR/build.log"; }

conformance_run() {
  "$PY" -m pytest --platform=cuda -n "$JOBS" -p no:cacheprovider --conformance-json="$LOG_DIR/conformance-cuda.json"
}
conformance_detail() {
  "$PY" - "$LOG_DIR/conformance-cuda.json" <<'EOF'
import collections, json, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception as exc:
    print(f"no results file ({type(exc).__name__})"); sys.exit()
counts = collections.Counter(r["outcome"] for r in doc.get("results", []))
print(f"verdict {doc.get('verdict')}: " + ", ".join(f"{n} {o}" for o, n in counts.most_common()))
EOF
}

tests_run() { "$PY" -m pytest -n "$JOBS" -p no:cacheprovider --timeout=600 tests; }
tests_detail() { grep -E '^=+ .*(passed|failed|error).* in ' "$LOG_DIR/tests.log" | tail -n 1 | tr -d '='; }

bench_run() { "$PY" benchmarks/bench_kernels.py --device cuda; }

want() { [[ " $STEPS " == *" $1 "* ]]; }
if ! want install || step install install_detail install; then   # nothing else can run uninstalled
  want build && step build build_detail build
  want conformance && step conformance conformance_detail conformance_run
  want tests && step tests tests_detail tests_run
  want bench && step bench - bench_run
fi

echo "gpu-check summary (logs in $LOG_DIR):"
printf '  %s\n' "${SUMMARY[@]}"
if [ $FAILED -ne 0 ]; then
  echo "gpu-check: FAILED"
  exit 1
fi
echo "gpu-check: all steps ok"
