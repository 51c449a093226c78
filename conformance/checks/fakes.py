"""Fake copies of a case's arguments as compile lowering sees them: no data, any batch size, symbolic dims.

Lowering calls `supports_args` and traces implementations on fake tensors whose batch dimension
(or, with `dynamic=True`, every dimension) is a symbol. These builders give the checks the same
view for free: no memory is allocated, so a batch of 65537 rows costs nothing. Data pointers of
these fakes raise instead of returning a dangling address, so probed vendor code fails cleanly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch._functorch.config
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from conformance.checks.batch import batched_indices

if TYPE_CHECKING:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv


def _fake_mode(shape_env: ShapeEnv | None) -> FakeTensorMode:
    with torch._functorch.config.patch(fake_tensor_allow_unsafe_data_ptr_access=False):
        return FakeTensorMode(shape_env=shape_env)


def _fake(mode: FakeTensorMode, like: torch.Tensor, sizes, strides, storage_offset=0) -> FakeTensor:
    """A fake tensor of `like`'s dtype and device with these (possibly symbolic) sizes, strides and storage offset,
    made straight from a meta tensor. Converting `like` (from_tensor, or empty_strided under the mode) gives the same
    tensor to a predicate or a trace at 3-10x the cost. It is a view of nothing, as a graph input is not."""
    meta = torch.empty_strided(sizes, strides, dtype=like.dtype, device="meta")
    if isinstance(storage_offset, torch.SymInt) or storage_offset:
        meta = meta.as_strided(sizes, strides, storage_offset)
    return FakeTensor(mode, meta, like.device)


def _fake_like(mode: FakeTensorMode, like: torch.Tensor) -> FakeTensor:
    """A fake of `like` with its own sizes, strides and storage offset."""
    return _fake(mode, like, like.shape, like.stride(), like.storage_offset())


@dataclasses.dataclass
class FakeArgs:
    """Fake arguments, their mode and shape environment, and readable names of their symbols."""

    args: tuple
    mode: FakeTensorMode
    shape_env: ShapeEnv | None = None
    batch_symbols: frozenset = frozenset()
    names: dict = dataclasses.field(default_factory=dict)   # sympy symbol -> "x.shape[0]", "x.stride(0)"

    def involves_batch(self, expr) -> bool:
        return bool(getattr(expr, "free_symbols", set()) & self.batch_symbols)

    def render(self, expr) -> str:
        """`expr` with symbols named after the argument dims they stand for (deterministic text)."""
        import sympy

        mapping = {s: sympy.Symbol(n) for s, n in self.names.items()}
        return str(expr.xreplace(mapping)) if hasattr(expr, "xreplace") else str(expr)


def exact(args: Sequence[Any]) -> FakeArgs:
    """Fakes with each tensor's own sizes, strides and storage offset, in a fresh mode with a shape environment:
    what `torch.library.opcheck`'s fake-tensor test converts the arguments to (`from_tensor(static_shapes=True)`)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = _fake_mode(ShapeEnv())
    out = tuple(_fake_like(mode, a) if isinstance(a, torch.Tensor) else a for a in args)
    return FakeArgs(out, mode, mode.shape_env)


class BatchFakes:
    """Fakes of one case's arguments at any number of rows (sizes static; strides, dtype, device kept). One fake
    mode serves every row count, and arguments without a batch dim are converted once, not once per count."""

    def __init__(self, op, args: Sequence[Any]):
        self.args = tuple(args)
        self.batched = batched_indices(op, args)
        self.mode = _fake_mode(None)
        self.fixed = {i: _fake_like(self.mode, a) for i, a in enumerate(args)
                      if isinstance(a, torch.Tensor) and i not in self.batched}

    def at(self, rows: int) -> FakeArgs:
        """Fakes with `rows` rows in every batched argument."""
        out = []
        for i, a in enumerate(self.args):
            if i in self.batched:
                out.append(_fake(self.mode, a, (rows, *a.shape[1:]), a.stride()))
            else:
                out.append(self.fixed.get(i, a))
        return FakeArgs(tuple(out), self.mode)


def symbolic(op, args: Sequence[Any], *, every_dim: bool = False) -> FakeArgs:
    """Fakes whose batch dimension (or, with `every_dim`, every dimension) is a symbol, each size
    >= 2 as torch.compile assumes; `args` must already have >= 2 rows where batched."""
    # imported here: Dynamo costs 2 s, sympy 0.5 s, and enumerating units (the xdist controller's plan) needs neither
    import sympy
    from torch._dynamo.source import LocalSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    batched = batched_indices(op, args)
    shape_env = ShapeEnv()
    mode = _fake_mode(shape_env)
    out, names, batch_symbols = [], {}, set()
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            out.append(a)
            continue
        # the batch dims are one symbol (duck sized), as in a compiled program where every activation
        # derives from the same token count: `x.shape == x_residual.shape` is no guard on the batch
        dims = [DimDynamic.DUCK if i in batched and d == 0 else DimDynamic.DYNAMIC if every_dim else DimDynamic.STATIC
                for d in range(a.ndim)]
        name = op.param_names[i]
        sizes, strides, offset = shape_env.create_symbolic_sizes_strides_storage_offset(
            a, LocalSource(name), symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims))
        fake = _fake(mode, a, sizes, strides, offset)
        out.append(fake)
        named = [(f"{name}.shape[{d}]", fake.shape[d]) for d in range(a.ndim)]
        named += [(f"{name}.stride({d})", fake.stride(d)) for d in range(a.ndim)]
        for what, value in named:   # sizes first: a contiguous stride is a size's symbol
            expr = value.node.expr if isinstance(value, torch.SymInt) else None
            if isinstance(expr, sympy.Symbol):
                names.setdefault(expr, what)
        if i in batched and isinstance(fake.shape[0], torch.SymInt):
            batch_symbols |= fake.shape[0].node.expr.free_symbols
    return FakeArgs(tuple(out), mode, shape_env, frozenset(batch_symbols), names)
