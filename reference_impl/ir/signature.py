"""Static signatures of IR op arguments: the keys of the selection cache (docs/ir-dispatch.md).

A predicate may read a tensor's device, dtype, shape outside the batch dimension and strides,
and the values of non-tensor arguments. An exact signature records exactly that, with every size;
`static_signature` writes batch dimensions of size >= 2 as `BATCH`, so a new batch size finds the
selection made for another one without asking the predicates again. Storage offset and data
pointers are left out on purpose: a compiled graph cannot specialise on them either, so a
predicate that read them would select differently in eager and compiled code. Fake, subclassed
or symbolic arguments and values of other types make a signature `None` (not cacheable).
"""

from __future__ import annotations

from reference_impl.ir.guard import PLAIN_TENSOR_TYPES

# Non-tensor argument types whose values enter a signature, with the type (True == 1 == 1.0).
SCALAR_TYPES = frozenset({bool, int, float, str, type(None)})


class _BatchDim:
    """Marker standing for a batch dimension of size >= 2 in a static signature."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "BATCH"


BATCH = _BatchDim()


def exact_signature(args: tuple) -> tuple | None:
    """The exact signature of complete positional arguments, or None when they have none.

    Per tensor (exactly `torch.Tensor` or `nn.Parameter`) its dtype, device, shape and strides; per
    value of a `SCALAR_TYPES` type, the type and the value. Anything else (fake or subclassed
    tensors, symbolic sizes, lists) and layouts without strides (sparse) give None: not cacheable.
    The entries are flat; a tensor's begin with a dtype and a value's with a type, so two different
    argument lists never give the same signature.
    """
    key: list = []
    for a in args:
        cls = type(a)
        if cls in PLAIN_TENSOR_TYPES:
            try:
                key += (a.dtype, a.device, a.shape, a.stride())
            except RuntimeError:     # a layout without strides (sparse, nested)
                return None
        elif cls in SCALAR_TYPES:
            key += (cls, a)
        else:
            return None
    return tuple(key)


def static_signature(args: tuple, batch_arg: int | None, activations: frozenset[int]) -> tuple | None:
    """`exact_signature` with batch dimensions of size >= 2 written as `BATCH`.

    The batch is the leading size n of the first activation `args[batch_arg]`. Dim 0 of every
    tensor leading with n (and a non-zero stride) is the batch dimension, as in the conformance
    dispatch check; sizes 0 and 1 stay exact, since torch.compile specialises them and a
    predicate may answer differently there (contiguity of one row). Callers compute the exact
    signature first, so the arguments are known to be cacheable: tensors and scalar values.
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
