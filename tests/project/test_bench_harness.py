"""benchmarks/bench_harness.py: one small round runs, checks every run's results against the first's, and prints
the times against the targets and the check-time breakdown; a bad --modes is one usage line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_harness.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_a_small_round_prints_times_and_the_breakdown():
    proc = _run("--modes", "warm", "--rounds", "1", "--level", "quick", "--select", "rms_norm and float32 and cpp",
                "--workers", "0")   # no xdist workers: two more torch imports on CI's two busy cores
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "round 1 warm this: " in out and "results differ" not in out
    [row] = [ln for ln in out.splitlines() if ln.startswith("warm ") and " this " in ln]
    assert row.split()[-2:-1] == ["20"]   # the warm target, in seconds
    assert "check time by check, warm" in out and "numerics.test_ir_case" in out and "sum of check time" in out


def test_an_unknown_mode_is_a_usage_error():
    proc = _run("--modes", "tepid")
    assert proc.returncode == 2 and "--modes: cold, warm or both, got 'tepid'" in proc.stderr
