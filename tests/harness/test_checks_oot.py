"""The dispatch family's proof that a CustomOp replacement's own code runs, in-process: what the
dispatcher built and picked is inspected, what ran is recorded, and a replacement that only reaches
in-tree code is named with what runs instead and the fix."""

from __future__ import annotations

import torch

from conformance.checks.common import native_only
from conformance.checks.oot import own_code_problem, ran_own, recording, reference_target, vendor_classes
from reference_impl.custom_op import CustomOp
from reference_impl.layers.layernorm import RMSNorm
from reference_impl.platforms import Platform, PlatformEnum, activate_platform


class _Oot(Platform):
    _enum = PlatformEnum.OOT
    device_name = device_type = "cpu"


class CudaOnlyNorm(RMSNorm):
    def forward_cuda(self, x, residual=None):
        return self.forward_native(x, residual)


class OotNorm(RMSNorm):
    def forward_oot(self, x, residual=None):
        return self.forward_native(x, residual)


class DisabledNorm(OotNorm):
    @classmethod
    def enabled(cls) -> bool:
        return False


class CudaDispatchNorm(OotNorm):
    def dispatch_forward(self):
        return self.forward_native


class ShadowNorm(RMSNorm):
    """A vendor class that happens to carry the in-tree class's name: told apart by its code."""

    def forward_cuda(self, x, residual=None):
        return self.forward_native(x, residual)


ShadowNorm.__name__ = ShadowNorm.__qualname__ = "RMSNorm"


def _problem(cls):
    """Build `cls` on an out-of-tree platform, call what the reference CustomOp dispatch picks with IR ops on native
    (no platform kernels needed), recording; (target, calls, own_code_problem)."""
    with activate_platform(_Oot()):
        layer = cls(64)
        target = reference_target(layer, RMSNorm)
        with native_only(), recording([c for c in cls.__mro__ if c not in (torch.nn.Module, object)]) as calls:
            target.method(torch.randn(2, 64))
    return target, calls, own_code_problem(target, calls)


def test_inherited_fallback_is_named_with_what_runs_instead_and_the_fix():
    _, calls, problem = _problem(CudaOnlyNorm)
    assert [label for label, _ in calls] == ["CustomOp.forward_oot", "RMSNorm.forward_native"]
    assert problem == ("CudaOnlyNorm defines forward_cuda only; on this platform the reference CustomOp runs "
                       "RMSNorm.forward_oot (reference code, inherited from CustomOp), which runs "
                       "RMSNorm.forward_native: define forward_oot")


def test_enabled_that_says_no_is_named_with_the_fix():
    target, _, problem = _problem(DisabledNorm)
    assert (target.enabled, target.method.__name__, target.platform_method) == (False, "forward_native", "forward_oot")
    assert problem == ("DisabledNorm defines enabled, forward_oot; on this platform the reference CustomOp runs "
                       "RMSNorm.forward_native (reference code), because DisabledNorm.enabled() returns False with "
                       "custom ops on: drop the enabled() override (or return super().enabled()) so the op follows "
                       "custom_ops and forward_oot runs")


def test_dispatch_forward_that_skips_forward_oot_is_named_with_the_fix():
    _, _, problem = _problem(CudaDispatchNorm)
    assert problem == ("CudaDispatchNorm defines dispatch_forward, forward_oot; on this platform the reference "
                       "CustomOp runs RMSNorm.forward_native (reference code), because "
                       "CudaDispatchNorm.dispatch_forward picks forward_native where the reference CustomOp's own "
                       "dispatch_forward picks forward_oot: drop the dispatch_forward override (or return "
                       "self.forward_oot on this platform)")


def test_replacement_whose_own_method_runs_passes_and_what_ran_is_recorded():
    assert vendor_classes(OotNorm, RMSNorm) == [OotNorm]
    target, calls, problem = _problem(OotNorm)
    assert problem is None and ran_own(target, calls) == ["OotNorm.forward_oot"]


def test_own_code_is_told_apart_by_code_not_by_name():
    _, calls, problem = _problem(ShadowNorm)
    assert "RMSNorm.forward_native" in [label for label, _ in calls]
    assert problem is not None and problem.startswith("RMSNorm defines forward_cuda only; on this platform")


def test_recording_restores_the_previous_profile_hook():
    import sys

    def outer(frame, event, arg):
        return None

    sys.setprofile(outer)
    try:
        _problem(OotNorm)
        assert sys.getprofile() is outer
    finally:
        sys.setprofile(None)
    assert CustomOp in CudaOnlyNorm.__mro__
