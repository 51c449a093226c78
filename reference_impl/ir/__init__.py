"""The functional IR: declare ops with `register_op`, implement them with `ir.ops.<name>.register_impl`."""

from reference_impl.ir.cases import OpCase
from reference_impl.ir.op import (
    DEFAULT_TOLERANCES,
    LIB_NAMESPACE,
    IrDispatchError,
    IrOp,
    IrOpImpl,
    IrOpInplaceOverload,
    IrRegistrationError,
    register_op,
)
from reference_impl.ir import ops

__all__ = ["register_op", "IrOp", "IrOpImpl", "IrOpInplaceOverload", "IrRegistrationError",
           "IrDispatchError", "OpCase", "ops", "LIB_NAMESPACE", "DEFAULT_TOLERANCES"]
