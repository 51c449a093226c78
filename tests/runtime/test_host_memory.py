"""models/host_memory.py: after keep_freed_memory() a large tensor freed and allocated again reuses its pages
(no page faults); without it glibc maps fresh pages every time. Run in subprocesses: the setting is per process."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

PROBE = """
import resource, sys, torch
from reference_impl.models.host_memory import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.ones(16 << 20)   # 64 MB: above glibc's largest mmap threshold (32 MB)
    del t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults()
print(applied, faults())
"""


def _probe(mode: str) -> tuple[str, int]:
    run = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    applied, faults = run.stdout.split()
    return applied, int(faults)


@pytest.mark.skipif(not GLIBC, reason="the setting is glibc malloc's")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    applied, faults = _probe("keep")
    assert applied == "True"
    assert faults < 1000, f"{faults} page faults for a 64 MB tensor allocated the second time"
    _, system_faults = _probe("system")
    assert system_faults > 10000, "the control: glibc's default maps a 64 MB tensor afresh (16384 pages)"


@pytest.mark.skipif(GLIBC, reason="only a C library other than glibc leaves malloc alone")
def test_other_c_libraries_are_left_alone():
    assert _probe("keep")[0] == "False"
