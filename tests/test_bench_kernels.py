"""benchmarks/bench_kernels.py: the CUDA mode refuses with one line where no CUDA device exists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_kernels.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device: the refusal path cannot occur")
def test_cuda_mode_without_a_cuda_device_fails_with_one_line():
    proc = _run("--device", "cuda", "--ops", "rms_norm")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("bench_kernels.py --device cuda: torch ")
    assert "CUDA" in lines[0] and "run it on a machine with a CUDA GPU" in lines[0]

