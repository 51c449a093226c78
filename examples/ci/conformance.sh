#!/usr/bin/env bash
# A conformance gate for a platform plugin's CI, on any CI system: install, run N shards, merge them,
# gate on the verdict, the waivers and the baseline, and leave an HTML report.
#
#   conformance.sh install          pip install $HARNESS_SPEC and $PLUGIN_SPEC (each when set)
#   conformance.sh shard I N        run shard I of N          -> $OUT_DIR/shard-I-of-N.json
#   conformance.sh gate             merge $OUT_DIR/shard-*.json -> all.json, report.html, report.md;
#                                   compare with $BASELINE (when set) -> compare.md; exit status = gate
#   conformance.sh all              install, then shards 1..$SHARDS one after another, then gate
#
# Extra arguments after `shard I N` or `all` go to pytest (e.g. -n 2, -k rms_norm).
# Environment:
#   PLATFORM      platform entry-point name to check (required for shard/all)
#   SHARDS        number of shards for `all` (default 2)
#   LEVEL         quick | standard | full (default standard)
#   SEED          --conformance-seed (default: the harness's)
#   WAIVERS       expected-failures manifest, TOML or JSON (optional)
#   BASELINE      results file of the last accepted run; a PASS that got worse fails the gate (optional)
#   OUT_DIR       where results and reports go (default conformance-results)
#   PYTHON        the interpreter the harness is installed in (default python3)
#   HARNESS_SPEC, PLUGIN_SPEC, PIP_ARGS   what `install` passes to pip (e.g. PIP_ARGS="-c constraints.txt")
# Exit status (the harness's own table): 0 the gate passed (merged verdict CONFORMANT, no regression
# against the baseline), 1 the gate failed, 4 nothing could be judged (a shard did not complete, the
# shards cannot be merged, a file cannot be read, bad usage).
set -euo pipefail

PYTHON=${PYTHON:-python3}
OUT_DIR=${OUT_DIR:-conformance-results}
LEVEL=${LEVEL:-standard}
SHARDS=${SHARDS:-2}

say() { printf 'conformance.sh: %s\n' "$*" >&2; }

cmd_install() {
  local specs=()
  [ -n "${HARNESS_SPEC:-}" ] && specs+=("$HARNESS_SPEC")
  [ -n "${PLUGIN_SPEC:-}" ] && specs+=("$PLUGIN_SPEC")
  if [ ${#specs[@]} -eq 0 ]; then
    say "install: neither HARNESS_SPEC nor PLUGIN_SPEC is set; using what $PYTHON already has"
    return 0
  fi
  # shellcheck disable=SC2086  # PIP_ARGS holds several words on purpose
  "$PYTHON" -m pip install ${PIP_ARGS:-} "${specs[@]}"
}

cmd_shard() {
  local index=$1 total=$2
  shift 2
  : "${PLATFORM:?set PLATFORM to the platform entry-point name}"
  mkdir -p "$OUT_DIR"
  local out="$OUT_DIR/shard-$index-of-$total.json"
  local args=(--platform="$PLATFORM" --conformance-level="$LEVEL" --conformance-shard="$index/$total"
              --conformance-json="$out" -p no:cacheprovider)
  [ -n "${SEED:-}" ] && args+=(--conformance-seed="$SEED")
  [ -n "${WAIVERS:-}" ] && args+=(--conformance-waivers="$WAIVERS")
  say "shard $index/$total of platform $PLATFORM -> $out"
  local status=0
  "$PYTHON" -m pytest "${args[@]}" "$@" || status=$?
  # 0 conformant, 1 checks failed, 5 nothing selected in this shard: the gate decides on the merged
  # file. Anything else (4 misconfiguration, 2 interrupted, 3 internal error) means no usable results.
  case $status in
    0 | 1 | 5) [ -s "$out" ] && return 0 ;;
  esac
  say "shard $index/$total did not complete (pytest exit status $status)"
  return 4
}

cmd_gate() {
  shopt -s nullglob
  local shards=("$OUT_DIR"/shard-*.json)
  shopt -u nullglob
  if [ ${#shards[@]} -eq 0 ]; then
    say "gate: no shard results in $OUT_DIR"
    return 4
  fi
  local all="$OUT_DIR/all.json"
  rm -f "$all" "$OUT_DIR/compare.md" "$OUT_DIR/report.html" "$OUT_DIR/report.md"  # nothing stale is uploaded
  "$PYTHON" -m conformance merge "${shards[@]}" -o "$all" || { say "gate: the shards could not be merged"; return 4; }
  "$PYTHON" -m conformance report "$all" -o "$OUT_DIR/report.html" || { say "gate: no HTML report"; return 4; }
  "$PYTHON" -m conformance report "$all" -o "$OUT_DIR/report.md" || { say "gate: no Markdown report"; return 4; }

  local verdict
  verdict=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["verdict"])' "$all") ||
    { say "gate: $all has no verdict"; return 4; }
  local gate=0
  [ "$verdict" = CONFORMANT ] || gate=1

  local regressions="not compared (no BASELINE)"
  if [ -n "${BASELINE:-}" ]; then
    local status=0
    "$PYTHON" -m conformance compare "$BASELINE" "$all" --markdown "$OUT_DIR/compare.md" || status=$?
    case $status in
      0) regressions="none" ;;
      1) regressions="found (see $OUT_DIR/compare.md)"; gate=1 ;;
      *) say "gate: comparing with $BASELINE failed (exit status $status)"; return 4 ;;
    esac
  fi
  say "verdict $verdict; regressions against the baseline: $regressions; report: $OUT_DIR/report.html"
  if [ $gate -eq 0 ]; then say "gate PASSED"; else say "gate FAILED"; fi
  return $gate
}

cmd_all() {
  cmd_install
  rm -f "$OUT_DIR"/shard-*.json  # shards of an earlier run would not merge with these
  local i
  for ((i = 1; i <= SHARDS; i++)); do
    cmd_shard "$i" "$SHARDS" "$@"
  done
  cmd_gate
}

case "${1:-}" in
  install) cmd_install ;;
  shard) [ $# -ge 3 ] || { say "usage: $0 shard I N [pytest args...]"; exit 4; }; shift; cmd_shard "$@" ;;
  gate) cmd_gate ;;
  all) shift; cmd_all "$@" ;;
  *) say "usage: $0 install | shard I N [pytest args...] | gate | all [pytest args...]"; exit 4 ;;
esac
