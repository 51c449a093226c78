"""benchmarks/bench_collectives.py: one small round on 2 gloo ranks prints a row per collective with the reference's
ratios; bad --sizes is one usage line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_collectives.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_a_small_round_prints_both_collectives_against_gloo():
    proc = _run("--sizes", "4096", "--rounds", "1", "--min-time", "0.01", "--no-vllm")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = {ln.split("|")[0].strip(): [c.strip() for c in ln.split("|")] for ln in proc.stdout.splitlines()
            if ln.strip().startswith(("all_reduce", "all_gather"))}
    assert set(rows) == {"all_reduce", "all_gather"}
    assert rows["all_reduce"][1] == "4 KB" and rows["all_reduce"][4].endswith("x") and rows["all_reduce"][6].endswith("x")
    assert rows["all_gather"][5] == "-" and rows["all_gather"][7] == "-"   # no gloo+copy form, no vLLM column
    assert "vLLM's CpuCommunicator: skipped (--no-vllm)" in proc.stdout


def test_bad_sizes_are_a_usage_error():
    proc = _run("--sizes", "4096,6")
    assert proc.returncode == 2 and "--sizes: each size is a positive multiple of 4 bytes" in proc.stderr
