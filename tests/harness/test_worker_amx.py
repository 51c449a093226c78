"""A kernel worker asks Linux for AMX tile state on a CPU with AMX (reference_impl.utils.enable_amx_tiles, which
conformance.run.worker.serve and the CPU benchmarks call), so an
AMX kernel that assumes it (vLLM's bf16 CPU attention) cannot die of SIGILL only because no earlier check in the same
worker ran a bf16 GEMM. Read back with arch_prctl(ARCH_GET_XCOMP_PERM): the XTILEDATA bit."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

PERMITTED = """
import ctypes, sys, torch
ARCH_GET_XCOMP_PERM, XFEATURE_XTILEDATA, SYS_arch_prctl = 0x1022, 18, 158
if sys.argv[1] == "worker":
    from reference_impl.utils import enable_amx_tiles
    print("granted" if enable_amx_tiles() else "refused")
mask = ctypes.c_uint64(0)
libc = ctypes.CDLL(None, use_errno=True)
assert libc.syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) == 0, ctypes.get_errno()
print("tiles" if mask.value >> XFEATURE_XTILEDATA & 1 else "no tiles")
"""


def _permitted(mode: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PERMITTED, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux") or not torch.cpu._is_amx_tile_supported(),
                    reason="this CPU has no AMX (grep amx_tile /proc/cpuinfo): nothing to ask for")
def test_a_worker_holds_amx_tile_state_a_fresh_process_does_not():
    assert _permitted("fresh") == ["no", "tiles"]      # importing torch alone does not ask
    assert _permitted("worker") == ["granted", "tiles"]


@pytest.mark.skipif(torch.cpu._is_amx_tile_supported(), reason="this CPU has AMX: the test above covers it")
def test_without_amx_nothing_is_asked():
    from reference_impl.utils import enable_amx_tiles

    assert enable_amx_tiles() is False
