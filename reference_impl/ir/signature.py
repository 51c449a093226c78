"""Static signatures of IR op arguments: the keys of the selection cache (docs/ir-dispatch.md).

A predicate may read a tensor's device, dtype, shape outside the batch dimension and strides,
and the values of non-tensor arguments. An exact signature records exactly that, with every size
(the cheap key of the eager hot path); `static_signature` writes batch dimensions of size >= 2
as `BATCH`, so a new batch size finds the selection made for another one without asking the
predicates again. Storage offset and data pointers are left out on purpose: a compiled graph
cannot specialise on them either, so a predicate that read them would select differently in
eager and compiled code. Fake, subclassed or symbolic arguments and unhashable values make a
signature `None` (not cacheable).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from reference_impl.ir.guard import ABSENT, PLAIN_TENSOR_TYPES

# Non-tensor argument types whose values enter a signature, with the type (True == 1 == 1.0).
SCALAR_TYPES = frozenset({bool, int, float, str, type(None)})


class _BatchDim:
    """Marker standing for a batch dimension of size >= 2 in a static signature."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "BATCH"


BATCH = _BatchDim()


def key_source(names: Sequence[str], kinds: Sequence[str], fail: str) -> tuple[list[str], str]:
    """Source pieces computing an exact signature from arguments bound to `names`.

    `kinds` holds one entry per parameter: "tensor", "optional_tensor" or "value". Returns the
    checks (statements running `fail` when an argument is not cacheable) and the signature
    expression: per tensor, exactly `torch.Tensor` or `nn.Parameter`, its dtype, device, shape
    and strides; per value, its type and the value.
    """
    checks, parts = [], []
    for name, kind in zip(names, kinds):
        meta = f"{name}.dtype, {name}.device, {name}.shape, {name}.stride()"
        if kind == "tensor":
            checks.append(f"if type({name}) not in PLAIN_TENSOR_TYPES: {fail}")
            parts.append(meta)
        elif kind == "optional_tensor":
            checks.append(f"if {name} is not None and type({name}) not in PLAIN_TENSOR_TYPES: {fail}")
            parts.append(f"({meta}) if {name} is not None else None")
        elif kind == "value":
            checks.append(f"if type({name}) not in SCALAR_TYPES: {fail}")
            parts.append(f"type({name}), {name}")
        else:
            raise ValueError(f"unknown argument kind {kind!r}")
    return checks, f"({', '.join(parts)},)"


def repeat_source(names: Sequence[str], kinds: Sequence[str]) -> tuple[str, list[str], list[str], str]:
    """Source pieces telling whether a call repeats the latest selection's signature.

    The tensors go to one guard (reference_impl/ir/guard.py), an absent optional tensor as
    `ABSENT`; what the guard cannot see is kept beside it as fields: per optional tensor whether
    it is None, per value its type and the value. Returns the guard's argument list, the field
    names, the expressions computing the fields from the arguments, and the expression comparing
    the arguments with fields already unpacked (guard included, bound to `_guard`).
    """
    tensors, fields, values, compares = [], [], [], []
    for name, kind in zip(names, kinds):
        if kind == "tensor":
            tensors.append(name)
        elif kind == "optional_tensor":
            tensors.append(f"ABSENT if {name} is None else {name}")
            fields.append(f"_m_{name}_none")
            values.append(f"{name} is None")
            compares.append(f"({name} is None) is _m_{name}_none")
        else:
            fields += [f"_m_{name}_type", f"_m_{name}"]
            values += [f"type({name})", name]
            compares.append(f"type({name}) is _m_{name}_type and {name} == _m_{name}")
    compares.insert(0, f"_guard.check({', '.join(tensors)})")
    return ", ".join(tensors), fields, values, " and ".join(compares)


def generate(name: str, source: str, namespace: dict):
    """Compile generated `source` defining `name` with `namespace` as its globals; return it.

    Used where a per-op function with its arguments unrolled matters (the eager hot path): a loop
    over the arguments costs about half again as much. namedtuple and dataclasses do the same.
    """
    namespace = {"Tensor": Tensor, "SCALAR_TYPES": SCALAR_TYPES, "PLAIN_TENSOR_TYPES": PLAIN_TENSOR_TYPES,
                 "ABSENT": ABSENT, **namespace}
    exec(compile(source, f"<generated {name}>", "exec"), namespace)
    return namespace[name]


def exact_signature_fn(kinds: Sequence[str]) -> Callable[[tuple], tuple | None]:
    """A function from an op's completed argument tuple to its exact signature (None: uncacheable)."""
    names = [f"a{i}" for i in range(len(kinds))]
    checks, expr = key_source(names, kinds, "return None")
    source = "\n".join([
        "def exact_signature(args):",
        f"    {', '.join(names)}, = args",
        *(f"    {c}" for c in checks),
        "    try:",
        f"        return {expr}",
        "    except RuntimeError:  # a layout without strides (sparse, nested)",
        "        return None",
    ])
    return generate("exact_signature", source, {})


def argument_kinds(schema: torch.FunctionSchema) -> list[str]:
    """"tensor", "optional_tensor" or "value" per argument of a torch schema."""
    kinds = []
    for arg in schema.arguments:
        type_name = str(arg.type)
        kinds.append("tensor" if type_name == "Tensor" else
                     "optional_tensor" if type_name == "Optional[Tensor]" else "value")
    return kinds


def static_signature(args: tuple, batch_arg: int | None, activations: frozenset[int]) -> tuple | None:
    """`exact_signature` with batch dimensions of size >= 2 written as `BATCH`.

    The batch is the leading size n of the first activation `args[batch_arg]`. Dim 0 of every
    tensor leading with n (and a non-zero stride) is the batch dimension, as in the conformance
    dispatch check; sizes 0 and 1 stay exact, since torch.compile specialises them and a
    predicate may answer differently there (contiguity of one row). Callers compute the exact
    signature first, so the arguments are known to be cacheable; its optional tensors are None or
    tensors and its values are scalars.
    """
    batch = 0
    if batch_arg is not None:
        first = args[batch_arg]
        if type(first) in PLAIN_TENSOR_TYPES and first.dim():
            batch = first.shape[0]
            if batch < 2:
                batch = 0
    key: list = []
    shared = False      # a tensor other than an activation leads with the batch size
    for i, a in enumerate(args):
        cls = type(a)
        if cls in PLAIN_TENSOR_TYPES:
            shape = a.shape
            stride = a.stride()
            if batch and shape and shape[0] == batch and stride[0]:
                key += (a.dtype, a.device, BATCH, shape[1:], stride)
                if i not in activations:
                    shared = True
            else:
                key += (a.dtype, a.device, shape, stride)
        else:
            key += (cls, a)
    if shared and _batch_recurs(args, batch):
        return (batch, *key)
    return tuple(key)


def _batch_recurs(args: tuple, batch: int) -> bool:
    """Whether the batch size also occurs as a non-batch size, a stride or an int argument.

    A tensor that is not an activation but leads with the batch size (rotary positions, per-token
    scales) is taken as batched; should that size coincide with, say, the hidden size, it may be a
    [hidden] weight that a predicate compares with it, so the signature keeps the exact size.
    """
    for a in args:
        if type(a) in PLAIN_TENSOR_TYPES:
            shape = a.shape
            rest = shape[1:] if shape and shape[0] == batch else shape
            if batch in rest or batch in a.stride():
                return True
        elif type(a) is int and a == batch:
            return True
    return False
