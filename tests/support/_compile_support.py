"""Shared pieces of the compile-pipeline tests: a kernel-free CPU platform and test providers.

Torch library ops are permanent, so the custom ops here are defined once at import; the IR
providers are registered per test by `providers()` and removed afterwards.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor
from torch.fx import Graph

from reference_impl import ir
from reference_impl.platforms import Platform, PlatformEnum

far = ir.ops.fused_add_rms_norm
EPS = 1e-6


class CompileTestPlatform(Platform):
    """A CPU platform with no kernel defaults: every op runs native unless a test sets priorities."""

    _enum = PlatformEnum.CPU
    device_name = "compile_test_cpu"


@torch.library.custom_op("compile_test::fused_add_rms_norm_", mutates_args=("x", "x_residual"))
def _fused_add_kernel(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float) -> None:
    """Stand-in for a C++ in-place kernel: a torch op whose schema marks both activations mutated."""
    out, residual = far.native_fn(x, x_residual, weight, epsilon)
    x_residual.copy_(residual)
    x.copy_(out)


@torch.library.custom_op("compile_test::rms_norm", mutates_args=())
def _rms_norm_kernel(x: Tensor, weight: Tensor | None, epsilon: float) -> Tensor:
    """Stand-in for a functional kernel, so lowered graphs show which provider was inlined."""
    return ir.ops.rms_norm.native_fn(x, weight, epsilon)


@_rms_norm_kernel.register_fake
def _(x, weight, epsilon):
    return torch.empty_like(x)


def inplace_py(x, x_residual, weight, epsilon, variance_size=None):
    """In-place provider written with Python tensor ops (copy_ into the activations)."""
    out, residual = far.native_fn(x, x_residual, weight, epsilon, variance_size)
    x_residual.copy_(residual)
    x.copy_(out)
    return x, x_residual


def inplace_op(x, x_residual, weight, epsilon, variance_size=None):
    """In-place provider calling a mutating torch op, like the reference C++ kernels."""
    torch.ops.compile_test.fused_add_rms_norm_(x, x_residual, weight, epsilon)
    return x, x_residual


class KernelRmsNorm:
    """A functional rms_norm provider that declines `variance_size` and records what it was asked."""

    def __init__(self):
        self.supports_calls: list[tuple[type, ...]] = []

    def supports(self, x, weight, epsilon, variance_size=None):
        self.supports_calls.append(type(x))
        return variance_size is None

    @staticmethod
    def impl(x, weight, epsilon, variance_size=None):
        return torch.ops.compile_test.rms_norm(x, weight, epsilon)


@contextlib.contextmanager
def providers():
    """Register the test providers (`test_inplace_py`, `test_inplace_op`, `test_kernel`) for a block."""
    kernel = KernelRmsNorm()
    far.register_impl("test_inplace_py", inplace=True)(inplace_py)
    far.register_impl("test_inplace_op", inplace=True)(inplace_op)
    ir.ops.rms_norm.register_impl("test_kernel", supports_args=kernel.supports)(kernel.impl)
    try:
        yield kernel
    finally:
        far.remove_impl("test_inplace_py")
        far.remove_impl("test_inplace_op")
        ir.ops.rms_norm.remove_impl("test_kernel")


# ----- graph inspection -------------------------------------------------------------------------
def targets(graph: Graph) -> list:
    return [n.target for n in graph.nodes if n.op == "call_function"]


def count(graph: Graph, target) -> int:
    return sum(1 for t in targets(graph) if t is target)


def clones_of(graph: Graph) -> list[str]:
    """Names of the values cloned in `graph`."""
    return [n.args[0].name for n in graph.nodes
            if n.op == "call_function" and n.target is torch.ops.aten.clone.default]


def ir_nodes(graph: Graph) -> list[str]:
    return [str(t) for t in targets(graph) if "reference_ir" in str(t)]
