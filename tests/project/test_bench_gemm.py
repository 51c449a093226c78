"""benchmarks/bench_gemm.py: one small round prints its table, every column's output checked against float64
(the error it prints), with the ratios to the panel GEMM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reference_impl.kernels import cpu as cpu_kernels
from reference_impl.layers import cpu_gemm

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gemm.py"


@pytest.mark.skipif(not cpu_kernels.SUPPORTED or not cpu_gemm.available(),
                    reason="needs the C++ CPU kernels and oneDNN's linear ops")
def test_one_round_prints_the_table_with_checked_outputs():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dtypes", "bfloat16", "--rows", "1", "3", "--rounds", "1",
                           "--layers", "1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "threads; the weights of 1 layers and the LM head" in lines[0]
    assert lines[1].split()[:4] == ["dtype", "rows", "sum", "GB/s"]
    rows = [line.split() for line in lines[3:]]
    assert [(r[0], r[1]) for r in rows] == [("bfloat16", "1"), ("bfloat16", "3")]
    errors = [float(word.rstrip(")")) for line in lines[3:] for word in line.split() if word.endswith(")")]
    assert len(errors) == 6 and max(errors) < 2e-2, errors       # bf16 outputs: one rounding of the sums
    assert all(float(r[-1]) > 0 and float(r[-2]) > 0 for r in rows)


def test_bad_options_are_refused():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rows", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--rows and --rounds must be positive" in proc.stderr
