"""Fixtures of the kernel tests."""

from __future__ import annotations

import pytest
import torch

from reference_impl.kernels import _cpp_build
from reference_impl.kernels import cpu as cpu_kernels


@pytest.fixture(scope="module")
def ops():
    """`torch.ops.reference_cpu`, built (once, cached on disk) and loaded; skips where it cannot be built."""
    if not cpu_kernels.SUPPORTED:
        pytest.skip(f"C++ CPU kernels unavailable: {_cpp_build.toolchain_problem()}")
    _cpp_build.load()
    return torch.ops.reference_cpu
