"""Fault: register_oot under a name that matches no in-tree class ('RMSNormm', a typo of 'RMSNorm')."""

from reference_impl.custom_op import CustomOp
from reference_impl.layers.layernorm import RMSNorm

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("oot_name", {})
Platform.import_ir_kernels = lambda self: None


@CustomOp.register_oot("RMSNormm")
class TypoRMSNorm(RMSNorm):
    def forward_oot(self, x, residual=None):
        return self.forward_native(x, residual)

EXPECTED = Fault(family="dispatch", outcome="FAIL", fragments=("matches no in-tree CustomOp class",))
