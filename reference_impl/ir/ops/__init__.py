"""Every declared IR op, as `ir.ops.<name>`; ops registered elsewhere (plugins) appear here too."""

from reference_impl.ir.op import IrOp
from reference_impl.ir.ops.activation import (
    fatrelu_and_mul,
    gelu_and_mul,
    gelu_and_mul_sparse,
    gelu_fast,
    gelu_new,
    mul_and_silu,
    quick_gelu,
    relu2,
    silu_and_mul,
    swigluoai_and_mul,
)
from reference_impl.ir.ops.layernorm import fused_add_rms_norm, rms_norm
from reference_impl.ir.ops.quant import dynamic_group_quant_fp8, dynamic_quant_fp8, static_quant_fp8
from reference_impl.ir.ops.rotary import rotary_embedding, rotary_embedding_query
from reference_impl.ir.ops.fused import fused_add_rms_norm_static_fp8_quant, rms_norm_static_fp8_quant


def __getattr__(name: str) -> IrOp:
    try:
        return IrOp.registry[name]
    except KeyError:
        raise AttributeError(f"no IR op named {name!r}; declared: {sorted(IrOp.registry)}") from None


def __dir__():
    return sorted(set(globals()) | set(IrOp.registry))


__all__ = [
    "rms_norm", "fused_add_rms_norm",
    "silu_and_mul", "mul_and_silu", "gelu_and_mul", "gelu_and_mul_sparse", "fatrelu_and_mul", "swigluoai_and_mul",
    "gelu_new", "gelu_fast", "quick_gelu", "relu2",
    "rotary_embedding", "rotary_embedding_query",
    "static_quant_fp8", "dynamic_quant_fp8", "dynamic_group_quant_fp8",
    "rms_norm_static_fp8_quant", "fused_add_rms_norm_static_fp8_quant",
]
