"""The dispatch family's proof that a CustomOp replacement's own code runs, in-process: what ran is
recorded, and a replacement that only reaches in-tree code is named with what runs instead."""

from __future__ import annotations

import types

import torch

from conformance.checks.common import native_only
from conformance.checks.oot import own_code_problem, recording, vendor_classes
from reference_impl.custom_op import CustomOp
from reference_impl.layers.layernorm import RMSNorm
from reference_impl.platforms import PlatformEnum

CTX = types.SimpleNamespace(platform_name="acme", platform=types.SimpleNamespace(_enum=PlatformEnum.OOT))


class CudaOnlyNorm(RMSNorm):
    def forward_cuda(self, x, residual=None):
        return self.forward_native(x, residual)


class OotNorm(RMSNorm):
    def forward_oot(self, x, residual=None):
        return self.forward_native(x, residual)


class ShadowNorm(RMSNorm):
    """A vendor class that happens to carry the in-tree class's name: told apart by its code."""

    def forward_cuda(self, x, residual=None):
        return self.forward_native(x, residual)


ShadowNorm.__name__ = ShadowNorm.__qualname__ = "RMSNorm"


def _run(cls, method="forward_oot"):
    """Call `method` of a fresh layer with IR ops on native (no platform kernels needed), recording."""
    layer = cls(64)
    with native_only(), recording([c for c in cls.__mro__ if c not in (torch.nn.Module, object)]) as calls:
        getattr(layer, method)(torch.randn(2, 64))
    return calls


def test_inherited_fallback_is_named_with_what_runs_instead():
    calls = _run(CudaOnlyNorm)
    assert [label for label, _ in calls] == ["CustomOp.forward_oot", "RMSNorm.forward_native"]
    assert own_code_problem(CTX, CudaOnlyNorm, RMSNorm, "forward_oot", calls) == (
        "CudaOnlyNorm defines forward_cuda but platform 'acme' (OOT) calls forward_oot, inherited from CustomOp, "
        "which falls back to forward_native: the replacement's own code never runs")


def test_replacement_whose_own_method_runs_passes():
    assert vendor_classes(OotNorm, RMSNorm) == [OotNorm]
    assert own_code_problem(CTX, OotNorm, RMSNorm, "forward_oot", _run(OotNorm)) is None


def test_own_code_is_told_apart_by_code_not_by_name():
    calls = _run(ShadowNorm)
    assert "RMSNorm.forward_native" in [label for label, _ in calls]
    problem = own_code_problem(CTX, ShadowNorm, RMSNorm, "forward_oot", calls)
    assert problem is not None and problem.startswith("RMSNorm defines forward_cuda but platform 'acme' (OOT)")


def test_recording_restores_the_previous_profile_hook():
    import sys

    def outer(frame, event, arg):
        return None

    sys.setprofile(outer)
    try:
        _run(OotNorm)
        assert sys.getprofile() is outer
    finally:
        sys.setprofile(None)
    assert CustomOp in CudaOnlyNorm.__mro__
