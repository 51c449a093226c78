"""The compile family's verdict on an implementation that branches on tensor values while traced.

Whether such an implementation raises a data-dependent-guard error during lowering or silently
takes another path depends on the torch version (2.11 raised GuardOnDataDependentSymNode where
2.13 let `torch.compiler.is_compiling()` steer it). The harness must give a compile FAIL either way;
these tests force the raising path on any torch with an implementation that always reads values.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from conformance.checks import CheckContext, run_unit, tracing
from conformance.collect.units import Unit
from conformance.results.result import Outcome
from reference_impl import ir
from reference_impl.platforms import CpuPlatform, activate_platform

PROVIDER = "test_value_branch"
RAISING = "test_raises_while_traced"


def _value_branch_rms_norm(x, weight, epsilon, variance_size=None):
    if weight is not None and bool((weight == 1).all()):  # reads values: a guard on data under tracing
        weight = None
    return ir.ops.rms_norm.native_fn(x, weight, epsilon, variance_size)


def _raising_rms_norm(x, weight, epsilon, variance_size=None):
    if torch.compiler.is_compiling() or isinstance(x, torch._subclasses.FakeTensor):
        raise ValueError("refuses to be traced")
    return ir.ops.rms_norm.native_fn(x, weight, epsilon, variance_size)


@pytest.fixture
def providers():
    op = ir.ops.rms_norm
    op.register_impl(PROVIDER)(_value_branch_rms_norm)
    op.register_impl(RAISING)(_raising_rms_norm)
    try:
        with activate_platform(CpuPlatform()):
            yield CheckContext("cpu", CpuPlatform(), level="quick")
    finally:
        op.remove_impl(PROVIDER)
        op.remove_impl(RAISING)


def _compile(ctx, provider):
    verdict, _ = run_unit(ctx, Unit("compile", "ir_compile", "rms_norm", provider, "float32"))
    return verdict


def test_value_branch_in_lowering_is_a_compile_fail_with_a_diagnosis(providers):
    verdict = _compile(providers, PROVIDER)
    assert verdict.outcome is Outcome.FAIL, verdict.message
    assert "branches on tensor values while traced" in verdict.message, verdict.message
    assert "GuardOnDataDependentSymNode: Could not guard on data-dependent" in verdict.message, verdict.message
    assert f"provider '{PROVIDER}'" in verdict.message
    assert " at 0x" not in verdict.message  # no object reprs: messages are deterministic


def test_other_errors_while_traced_stay_errors(providers):
    verdict = _compile(providers, RAISING)
    assert verdict.outcome is Outcome.ERROR, verdict.message
    assert "refuses to be traced" in verdict.message and "branches on tensor values" not in verdict.message


def _guard_error() -> GuardOnDataDependentSymNode:
    try:
        raise GuardOnDataDependentSymNode(None, "Could not guard on data-dependent expression Eq(u0, 1)")
    except GuardOnDataDependentSymNode as exc:
        return exc


def test_classification_needs_the_implementations_own_frame():
    """A guard error raised outside the implementation (the harness or the pipeline) is not the
    implementation's fault; one raised through its frame is, wrapped however deep."""
    outside = _guard_error()
    assert tracing.classify_lowering_failure(outside, _value_branch_rms_norm) is None

    def impl(x):
        raise GuardOnDataDependentSymNode(None, "Could not guard on data-dependent expression Ne(u1, 0)")

    try:
        try:
            impl(None)
        except GuardOnDataDependentSymNode as inner:
            raise RuntimeError("backend failed") from inner
    except RuntimeError as wrapped:
        failure = tracing.classify_lowering_failure(wrapped, impl)
        assert failure is not None and failure.problem == tracing.BRANCHES_ON_VALUES
        assert failure.cause.startswith("GuardOnDataDependentSymNode: Could not guard on data-dependent "
                                        "expression Ne(u1, 0)"), failure.cause
        assert tracing.classify_lowering_failure(wrapped, _value_branch_rms_norm) is None
    assert tracing.classify_lowering_failure(ValueError("unrelated"), impl) is None
