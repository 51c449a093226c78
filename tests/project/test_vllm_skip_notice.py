"""tests/conftest.py's notice: a test run that skipped tests for want of vLLM says so in one loud line naming the
set-up command, and a run that skipped nothing for that reason prints no such line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

BODY = '''
import pytest

@pytest.mark.skipif(True, reason="vLLM is not installed here (bash scripts/setup.sh --vllm installs it)")
def test_needs_vllm():
    pass

@pytest.mark.skipif(True, reason="another reason")
def test_other():
    pass
'''


def _run(tmp_path: Path, body: str) -> str:
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "support").mkdir()
    (tmp_path / "test_body.py").write_text(body)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    return done.stdout


def test_skips_for_want_of_vllm_are_named(tmp_path):
    out = _run(tmp_path, BODY)
    assert "1 tests skipped because vLLM is not installed here" in out, out
    assert "bash scripts/setup.sh --vllm" in out


def test_no_notice_without_such_skips(tmp_path):
    out = _run(tmp_path, BODY.split("@pytest.mark.skipif(True, reason=\"another")[0].replace(
        "vLLM is not installed here", "something else"))
    assert "because vLLM is not installed" not in out, out
