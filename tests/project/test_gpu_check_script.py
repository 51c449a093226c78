"""scripts/gpu-check.sh is valid bash and refuses clearly, in one line, where there is no CUDA.

Its real run needs a GPU (see README); here CUDA_VISIBLE_DEVICES="" hides any GPU, so the
refusal is checked on every machine, with or without one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check.sh"


def _run(tmp_path: Path, python: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": python, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(["bash", str(SCRIPT), str(tmp_path / "logs")], env=env, capture_output=True, text=True,
                          timeout=120)


def test_script_is_valid_bash():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_refuses_without_cuda_in_one_line_and_touches_nothing(tmp_path):
    proc = _run(tmp_path, sys.executable)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert re.fullmatch(r"gpu-check: refused, no CUDA here for .+: torch \S+ (is not a CUDA build|sees no CUDA "
                        r"device)", lines[0]), lines[0]
    assert not (tmp_path / "logs").exists()


def test_refuses_a_python_that_does_not_exist(tmp_path):
    proc = _run(tmp_path, str(tmp_path / "no-such-python"))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"gpu-check: refused, no CUDA here: PYTHON={tmp_path / 'no-such-python'} "
                                        "is not an executable"]
