"""CustomOp replacements: the key is the replaced class's __name__ ("RMSNorm", not "rms_norm")."""

from reference_impl import ir
from reference_impl.custom_op import CustomOp
from reference_impl.layers.layernorm import RMSNorm


@CustomOp.register_oot("RMSNorm")
class MyVendorRMSNorm(RMSNorm):
    def forward_oot(self, x, residual=None):
        if residual is None:
            return ir.ops.rms_norm(x, self.weight, self.variance_epsilon, self.variance_size_override)
        return ir.ops.fused_add_rms_norm.maybe_inplace(x, residual, self.weight, self.variance_epsilon,
                                                       self.variance_size_override)
