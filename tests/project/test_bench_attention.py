"""benchmarks/bench_attention.py: a one-round run prints its table with every implementation's output checked
against ours (the difference column), and the machine line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reference_impl.attention import cpp_backend

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_attention.py"


@pytest.mark.skipif(not cpp_backend.available(), reason="C++ CPU kernels cannot be built here")
def test_one_round_prints_the_table():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--dtypes", "bfloat16", "--cases", "b=1 ctx=512",
                           "--rounds", "1", "--min-time", "0.001", "--no-vllm"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split("|")[0].strip() == "case" and "KV GB/s" in lines[0]
    rows = [[c.strip() for c in line.split("|")] for line in lines[2:]]
    assert [r[2] for r in rows] == ["cpp", "reference"]
    assert all(r[0] == "decode b=1 ctx=512" and r[1] == "bfloat16" for r in rows)
    assert float(rows[1][-1]) <= 1.6e-2, "the reference backend's output differs from the C++ kernel's"
    headers = [c.strip() for c in lines[0].split("|")]   # padded to the widest cell, which varies with the timing
    assert rows[0][headers.index("per round [quartiles]")] == "1.00x [1.00, 1.00]"
    assert "machine:" in proc.stderr and "vLLM: skipped (--no-vllm)" in proc.stderr


@pytest.mark.skipif(not cpp_backend.available(), reason="C++ CPU kernels cannot be built here")
def test_block_size_option_runs_the_runtimes_blocks_and_says_why_vllm_is_skipped():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--dtypes", "float32", "--cases", "prefill",
                           "--rounds", "1", "--min-time", "0.001", "--block-size", "16"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [[c.strip() for c in line.split("|")] for line in proc.stdout.splitlines()[2:]]
    assert [r[2] for r in rows] == ["cpp", "reference"]
    assert float(rows[1][-1]) <= 1e-4, "the reference backend's output differs from the C++ kernel's"
    assert "block=16;" in proc.stderr
    assert "vLLM: skipped (its CPU attention backend takes block sizes that are multiples of 32, not 16)" in proc.stderr
    bad = subprocess.run([sys.executable, str(SCRIPT), "--block-size", "0"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "--block-size must be a positive number of tokens, got 0" in bad.stderr


@pytest.mark.skipif(not cpp_backend.available(), reason="C++ CPU kernels cannot be built here")
def test_cold_cache_times_each_call_after_an_eviction_and_says_so():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--dtypes", "float32", "--cases", "b=1 ctx=512",
                           "--rounds", "1", "--cold-cache", "--no-vllm"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [[c.strip() for c in line.split("|")] for line in proc.stdout.splitlines()[2:]]
    assert [r[2] for r in rows] == ["cpp", "reference"] and float(rows[1][-1]) <= 1e-4
    assert "each call alone after evicting the caches" in proc.stderr
