"""Find what a unit names (IR op, provider impl, case, CustomOp classes), with clear errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def ir_op(name: str):
    from reference_impl.ir.op import IrOp

    try:
        return IrOp.registry[name]
    except KeyError:
        raise LookupError(f"no IR op named {name!r}; declared: {sorted(IrOp.registry)}") from None


def impl(op_name: str, provider: str):
    op = ir_op(op_name)
    try:
        return op.impls[provider]
    except KeyError:
        raise LookupError(f"op {op_name!r} has no provider {provider!r}; registered: {sorted(op.impls)}") from None


def ir_case(op_name: str, case_name: str):
    op = ir_op(op_name)
    for case in op.cases:
        if case.name == case_name:
            return case
    raise LookupError(f"op {op_name!r} declares no case {case_name!r}")


def in_tree_classes() -> dict[str, type]:
    """In-tree CustomOp classes by class `__name__` (the key register_oot must use)."""
    from reference_impl.custom_op import CustomOp

    return {cls.__name__: cls for cls in CustomOp.op_registry.values()}


def layer_classes(registered_name: str) -> tuple[type, type]:
    """(in-tree class registered as `registered_name`, its out-of-tree replacement)."""
    from reference_impl.custom_op import CustomOp

    try:
        in_tree = CustomOp.op_registry[registered_name]
    except KeyError:
        raise LookupError(f"no in-tree CustomOp registered as {registered_name!r}") from None
    try:
        return in_tree, CustomOp.op_registry_oot[in_tree.__name__]
    except KeyError:
        raise LookupError(f"no register_oot replacement of {in_tree.__name__}") from None


def layer_case(registered_name: str, case_name: str):
    return layer_record(registered_name).case(case_name)


def conformance_record(cls: type):
    """`cls`'s own declared `LayerConformance`, or None."""
    from reference_impl.layers.cases import conformance_of

    return conformance_of(cls)


def layer_record(registered_name: str):
    """The in-tree class's declared `LayerConformance` (tolerances and cases)."""
    from reference_impl.custom_op import CustomOp
    from reference_impl.layers.cases import conformance_of

    try:
        cls = CustomOp.op_registry[registered_name]
    except KeyError:
        raise LookupError(f"no in-tree CustomOp registered as {registered_name!r}") from None
    record = conformance_of(cls)
    if record is None:
        raise LookupError(f"{cls.__name__} declares no conformance cases")
    return record


@contextlib.contextmanager
def without_replacement(in_tree: type) -> Iterator[None]:
    """Construct the in-tree class itself inside the block (its replacement is set aside)."""
    from reference_impl.custom_op import CustomOp

    saved = CustomOp.op_registry_oot.pop(in_tree.__name__, None)
    try:
        yield
    finally:
        if saved is not None:
            CustomOp.op_registry_oot[in_tree.__name__] = saved
