"""Small FX helpers shared by the passes: IR-op lookup, argument normalization, fake values, aliasing."""

from __future__ import annotations

import operator
import re
from typing import Any

import torch
from torch.fx import Graph, Node
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.multiprocessing.reductions import StorageWeakRef

from reference_impl.ir.op import LIB_NAMESPACE, IrOp


def ir_op_of(node: Node) -> tuple[IrOp, bool] | None:
    """`(IrOp, is_maybe_inplace)` when `node` calls an IR op overload, else None."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    if node.target.namespace != LIB_NAMESPACE:
        return None
    op = IrOp.registry.get(node.target._opname)
    if op is None:
        return None
    if node.target is op.torch_op:
        return op, False
    inplace = getattr(op, "maybe_inplace", None)
    if inplace is not None and node.target is inplace.torch_op:
        return op, True
    return None


def is_ir_node(node: Node) -> bool:
    """True for any node still referring to the IR namespace (also inside higher-order op arguments)."""
    if node.op != "call_function":
        return False
    targets = [node.target, *node.args, *node.kwargs.values()]
    return any(isinstance(t, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))
               and getattr(t, "namespace", getattr(t, "_qualified_op_name", "").split("::")[0]) == LIB_NAMESPACE
               for t in targets)


def ir_args(node: Node, op: IrOp) -> list[Any]:
    """The node's arguments for `op`, positional, in parameter order, with defaults filled in."""
    args = list(node.args)
    for name in op.param_names[len(args):]:
        if name in node.kwargs:
            args.append(node.kwargs[name])
        else:
            default = op.signature.parameters[name].default
            if default is op.signature.empty:
                raise TypeError(f"node {node.name} calls IR op '{op.name}' without argument '{name}'")
            args.append(default)
    return args


def fake_value(arg: Any) -> Any:
    """The fake tensor (or SymInt) recorded for a node argument; literals pass through."""
    if isinstance(arg, Node):
        meta = arg.meta
        if "val" in meta:
            return meta["val"]
        if "example_value" in meta:
            return meta["example_value"]
        raise KeyError(f"node {arg.name} carries no fake value (meta 'val' / 'example_value')")
    if isinstance(arg, (list, tuple)):
        return type(arg)(fake_value(a) for a in arg)
    return arg


def node_tensors(node: Node) -> list[torch.Tensor]:
    """Tensors in a node's fake value (flattening tuples); empty when it has none."""
    try:
        val = fake_value(node)
    except KeyError:
        return []
    flat, _ = torch.utils._pytree.tree_flatten(val)
    return [t for t in flat if isinstance(t, torch.Tensor)]


def storages(node: Node) -> set[StorageWeakRef]:
    """The storages a node's value lives in (fake tensors keep view relationships)."""
    out = set()
    for t in node_tensors(node):
        try:
            out.add(StorageWeakRef(t.untyped_storage()))
        except (NotImplementedError, RuntimeError):
            pass
    return out


def positions(graph: Graph) -> dict[Node, int]:
    return {n: i for i, n in enumerate(graph.nodes)}


def placeholders(graph: Graph) -> list[Node]:
    return [n for n in graph.nodes if n.op == "placeholder"]


def getitem_users(node: Node) -> dict[int, Node]:
    """Index -> `operator.getitem(node, index)` user of a tuple-valued node."""
    out = {}
    for user in node.users:
        if user.target is operator.getitem and user.args[0] is node:
            out[user.args[1]] = user
    return out


def source_line(node: Node) -> str | None:
    """`file:line: code` of the user code that produced `node`, from Dynamo's stack trace."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    lines = [ln.rstrip() for ln in trace.strip().splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        m = re.match(r'\s*File "(.+)", line (\d+)', lines[i])
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return f"{m.group(1)}:{m.group(2)}: {code}"
    return None


def describe(node: Node) -> str:
    """A node's name plus the user source line that produced it, when known."""
    where = source_line(node)
    return f"'{node.name}' ({where})" if where else f"'{node.name}'"


def copy_graph(graph: Graph) -> Graph:
    """A structural copy of `graph` (node meta shared shallowly) for snapshots."""
    new = Graph()
    out = new.graph_copy(graph, {})
    new.output(out)
    return new


_METADATA_METHODS = frozenset({"size", "dim", "stride", "numel", "nelement", "ndimension", "is_contiguous",
                               "storage_offset", "element_size", "get_device", "is_floating_point"})
_METADATA_OPS = (torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int, torch.ops.aten.sym_numel.default,
                 torch.ops.aten.sym_storage_offset.default)


def reads_data(user: Node) -> bool:
    """False for nodes that only look at a tensor's metadata (getattr, size, stride, ...)."""
    if user.op == "call_function" and (user.target is getattr or user.target in _METADATA_OPS):
        return False
    if user.op == "call_method" and user.target in _METADATA_METHODS:
        return False
    return True


def _static(v) -> int | None:
    """`v` as a Python int when it is not symbolic, else None."""
    if isinstance(v, int):
        return v
    if isinstance(v, torch.SymInt):
        return v.node.maybe_as_int()
    return None


def may_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors may share memory: False only when provably disjoint, decided without
    adding shape guards (separate storages; disjoint element ranges; or column windows of the same
    rows, like q/k/v slices of one qkv buffer)."""
    try:
        if StorageWeakRef(a.untyped_storage()) != StorageWeakRef(b.untyped_storage()):
            return False
    except (NotImplementedError, RuntimeError):
        return True
    if a.element_size() != b.element_size():
        return True
    if any(s < 0 for s in (*a.stride(), *b.stride()) if _static(s) is not None):
        return True

    def end(t):
        return t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1

    if statically_known_true(end(a) <= b.storage_offset()) or statically_known_true(end(b) <= a.storage_offset()):
        return False
    if a.dim() >= 2 and a.dim() == b.dim():
        strides_a, strides_b = [_static(s) for s in a.stride()], [_static(s) for s in b.stride()]
        offsets = _static(a.storage_offset()), _static(b.storage_offset())
        widths = _static(a.shape[-1]), _static(b.shape[-1])
        if (None not in strides_a and strides_a == strides_b and strides_a[-1] == 1
                and None not in offsets and None not in widths):
            row = strides_a[-2]
            if row > 0 and all(s % row == 0 for s in strides_a[:-1]):
                ca, cb = offsets[0] % row, offsets[1] % row
                if ca + widths[0] <= row and cb + widths[1] <= row and (ca + widths[0] <= cb or cb + widths[1] <= ca):
                    return False
    return True
