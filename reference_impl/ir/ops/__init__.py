"""Every declared IR op, as `ir.ops.<name>`; ops registered elsewhere (plugins) appear here too."""

from reference_impl.ir.op import IrOp
from reference_impl.ir.ops.layernorm import fused_add_rms_norm, rms_norm


def __getattr__(name: str) -> IrOp:
    try:
        return IrOp.registry[name]
    except KeyError:
        raise AttributeError(f"no IR op named {name!r}; declared: {sorted(IrOp.registry)}") from None


def __dir__():
    return sorted(set(globals()) | set(IrOp.registry))


__all__ = ["rms_norm", "fused_add_rms_norm"]
