"""models/host_memory.py: after keep_freed_memory() a large tensor comes from glibc's heap, not from a fresh
mapping, and the heap keeps it after it is freed; without it glibc maps it afresh and unmaps it on free. Read
through glibc's own counters (mallinfo2), in subprocesses: the setting is per process. (Page faults are not
counted: a kernel that reclaims cold pages, as DAMON does on some VMs, can fault even kept memory in again.)"""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

PROBE = """
import ctypes, sys, torch
from reference_impl.models.host_memory import keep_freed_memory
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
if not hasattr(libc, "mallinfo2"):
    print("no-mallinfo2")
    sys.exit(0)
libc.mallinfo2.restype = MallInfo2
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
before = libc.mallinfo2()
t = torch.empty(16 << 20)   # 64 MB: above glibc's largest mmap threshold (32 MB)
during = libc.mallinfo2()
del t
after = libc.mallinfo2()
MB = 1 << 20
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
block = libc.malloc(64 * MB)   # nothing allocated after it: at the heap's top when mmap is off
grown = libc.mallinfo2().arena
libc.free(block)
print(applied, (during.hblkhd - before.hblkhd) // MB, (during.arena - before.arena) // MB,
      (after.arena - before.arena) // MB, (grown - libc.mallinfo2().arena) // MB)
"""


def _probe(mode: str) -> list[str]:
    run = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


@pytest.mark.skipif(not GLIBC, reason="the setting is glibc malloc's")
def test_a_freed_tensor_stays_in_the_heap_for_reuse():
    got = _probe("keep")
    if got == ["no-mallinfo2"]:
        pytest.skip("glibc older than 2.33 has no mallinfo2")
    applied, mapped, heap_during, heap_after, trimmed = got[0], *map(int, got[1:])
    assert applied == "True"
    assert mapped == 0, f"the 64 MB tensor was mapped afresh ({mapped} MB of mmapped blocks)"
    assert heap_during >= 60 and heap_after >= 60, f"heap grew {heap_during} MB, kept {heap_after} MB after free"
    assert trimmed == 0, f"freeing 64 MB at the heap's top gave {trimmed} MB back to the system"
    mapped, heap_during = map(int, _probe("system")[1:3])
    assert mapped >= 60 and heap_during < 60, "the control: glibc's default maps a 64 MB tensor afresh"


@pytest.mark.skipif(GLIBC, reason="only a C library other than glibc leaves malloc alone")
def test_other_c_libraries_are_left_alone():
    assert _probe("keep")[0] == "False"
