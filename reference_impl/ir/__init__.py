"""The functional IR: declare ops with `register_op`, implement them with `ir.ops.<name>.register_impl`.

A leaf of the package: it imports nothing else of `reference_impl`. Provider priorities reach it
through one hook, `set_priority_source` (reference_impl/ir/priority.py), which the runtime installs.
Whether an eager call goes through the torch op is one switch: `enable_torch_wrap` /
`set_default_torch_wrap` (off by default: straight to the selected implementation).
"""

from reference_impl.ir.cases import OpCase
from reference_impl.ir.op import (
    LIB_NAMESPACE,
    IrDispatchError,
    IrOp,
    IrOpImpl,
    IrOpInplaceOverload,
    IrRegistrationError,
    enable_torch_wrap,
    register_op,
    set_default_torch_wrap,
    torch_wrap_enabled,
)
from reference_impl.ir.priority import PriorityError, PrioritySource, get_priority_source, set_priority_source
from reference_impl.ir.tolerances import DEFAULT_TOLERANCES
from reference_impl.ir import tolerances
from reference_impl.ir import ops

__all__ = ["register_op", "IrOp", "IrOpImpl", "IrOpInplaceOverload", "IrRegistrationError",
           "IrDispatchError", "OpCase", "ops", "tolerances", "LIB_NAMESPACE", "DEFAULT_TOLERANCES",
           "PriorityError", "PrioritySource", "get_priority_source", "set_priority_source",
           "enable_torch_wrap", "set_default_torch_wrap", "torch_wrap_enabled"]
