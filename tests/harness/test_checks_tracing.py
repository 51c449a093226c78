"""The compile family's traceability diagnosis in-process: lowering's trace repeated on fakes, and
the one classifier that turns its exceptions into a FAIL with the fix."""

from __future__ import annotations

import ctypes
import types

import pytest
import torch

import reference_impl.ir.ops  # noqa: F401 - declares the ops
from conformance.checks import tracing
from reference_impl import ir

ARGS = (torch.randn(5, 64), torch.ones(64), 1e-6, None)


def _norm(x, weight, epsilon, variance_size=None):
    x32 = x.to(torch.float32)
    out = (x32 * torch.rsqrt(x32.square().mean(dim=-1, keepdim=True) + epsilon)).to(x.dtype)
    return out * weight if weight is not None else out


def launch_on_pointers(x, weight, epsilon, variance_size=None):
    out = torch.empty_like(x)
    result = _norm(x, weight, epsilon).contiguous()
    ctypes.memmove(out.data_ptr(), result.data_ptr(), result.numel() * result.element_size())
    return out


def reads_weight_pointer(x, weight, epsilon, variance_size=None):
    assert weight.data_ptr() % 4 == 0          # a static-size fake: must raise, not hand out an address
    return _norm(x, weight, epsilon)


def through_numpy(x, weight, epsilon, variance_size=None):
    return torch.from_numpy(_norm(x, weight, epsilon).numpy())


@torch.library.custom_op("conformance_test::wrapped_norm", mutates_args=())
def _wrapped(x: torch.Tensor, weight: torch.Tensor, epsilon: float) -> torch.Tensor:
    out = torch.empty_like(x)
    result = _norm(x, weight, epsilon).contiguous()
    ctypes.memmove(out.data_ptr(), result.data_ptr(), result.numel() * result.element_size())
    return out


@_wrapped.register_fake
def _(x, weight, epsilon):
    return torch.empty_like(x)


def wrapped(x, weight, epsilon, variance_size=None):
    return _wrapped(x, weight, epsilon)


def _impl(fn, inplace=False):
    return types.SimpleNamespace(impl_fn=fn, inplace=inplace)


@pytest.mark.parametrize("fn", [launch_on_pointers, reads_weight_pointer, through_numpy], ids=lambda f: f.__name__)
def test_kernels_that_read_fake_data_are_diagnosed_with_the_fix(fn):
    failure = tracing.trace_failure(ir.ops.rms_norm, _impl(fn), ARGS)
    assert failure is not None
    message = failure.message("rms_norm", "vendor")
    assert message.startswith("provider 'vendor' of rms_norm is not traceable by make_fx: it reads the data of a "
                              "fake tensor")
    assert "torch.library custom op" in message and "register_fake" in message
    # `at` names the frame's file by the last two parts of its path (`package/module.py`).
    assert failure.at is not None and failure.at.startswith("harness/test_checks_tracing.py:")
    assert failure.at.endswith(f" in {fn.__name__}")
    assert " at 0x" not in message


def test_wrapped_kernel_and_inplace_torch_code_trace():
    assert tracing.trace_failure(ir.ops.rms_norm, _impl(wrapped), ARGS) is None
    assert tracing.trace_failure(ir.ops.rms_norm, _impl(_norm), (torch.randn(1, 8), None, 1e-6, None)) is None

    def fused(x, x_residual, weight, epsilon, variance_size=None):
        x_residual.add_(x)
        x.copy_(_norm(x_residual, weight, epsilon))
        return x, x_residual

    args = (torch.randn(3, 16), torch.randn(3, 16), None, 1e-6, None)
    assert tracing.trace_failure(ir.ops.fused_add_rms_norm, _impl(fused, inplace=True), args) is None


def test_classifier_reads_through_wrapping_and_leaves_unknown_errors_alone():
    try:
        try:
            raise RuntimeError("Cannot access data pointer of Tensor (e.g. FakeTensor, FunctionalTensor). If you're "
                               "using torch.compile/export/fx, it is likely that we are erroneously tracing into a "
                               "custom kernel. To fix this, please wrap the custom kernel into an opaque custom op.")
        except RuntimeError as inner:
            raise ValueError("backend='<pkg.Backend object at 0x7f0011223344>' raised") from inner
    except ValueError as outer:
        failure = tracing.classify_lowering_failure(outer)
    assert failure is not None
    assert failure.cause == "RuntimeError: Cannot access data pointer of Tensor (e.g. FakeTensor, FunctionalTensor)"
    assert tracing.classify_lowering_failure(ValueError("shapes do not match")) is None


def test_trace_sees_what_lowering_sees_of_is_compiling():
    """Inside torch.compile (torch 2.13) lowering runs with is_compiling() true; so does the probe, so a
    kernel that branches on it is judged by the compile run, as lowering would trace it."""
    seen = []

    def branches(x, weight, epsilon, variance_size=None):
        seen.append(torch.compiler.is_compiling())
        return _norm(x, weight, epsilon)

    assert tracing.trace_failure(ir.ops.rms_norm, _impl(branches), ARGS) is None
    assert seen == [hasattr(torch.compiler, "_compile_session_context")]
