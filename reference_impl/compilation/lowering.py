"""Post-grad IR lowering: each IR op node becomes the graph of the implementation eager mode would run.

Selection calls `IrOp.dispatch` (the eager rule) on the fake tensors in node metadata; they bypass
the selection cache. Under symbolic sizes (`dynamic=True`) a predicate answering a SymBool is
resolved by a guard, which lands in the compiled function's guards: the graph is specialised on
that static property and a call breaking it recompiles and selects again (docs/ir-dispatch.md).
The selected `impl_fn` is traced with make_fx on those fake tensors and inlined in place of the node;
an in-place implementation is traced behind `aten.clone` of its activations, which keeps the
functional meaning (clone elimination removes the clones that are not needed).
"""

from __future__ import annotations

import contextlib
import itertools

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._guards import detect_fake_mode
from torch.fx import Graph, Node
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.traceback import preserve_node_meta

from reference_impl.compilation.errors import CompilationPipelineError
from reference_impl.compilation.fx_utils import fake_value, getitem_users, ir_args, ir_op_of, is_ir_node
from reference_impl.compilation.pass_manager import POST_GRAD, GraphPass, PassContext
from reference_impl.ir.op import IrOp, IrOpImpl

_constant_ids = itertools.count()


class IrLoweringPass(GraphPass):
    """Replace every IR op node by its selected implementation; `selected_impls` keeps the last run's choices."""

    name = "ir_lowering"
    stage = POST_GRAD

    def __init__(self, decompositions: dict | None = None):
        self.decompositions = decompositions
        self.selected_impls: dict[str, dict[str, str]] = {}

    def __call__(self, graph: Graph, ctx: PassContext) -> None:
        for node in list(graph.nodes):
            found = ir_op_of(node)
            if found is None:
                continue
            op, is_maybe_inplace = found
            if is_maybe_inplace:
                raise CompilationPipelineError(
                    f"node {node.name} still calls {op.name}.maybe_inplace at lowering; the inplace "
                    "functionalization pass must run before AOTAutograd")
            self._lower(graph, node, op, ctx)
        leftovers = [n for n in graph.nodes if is_ir_node(n)]
        if leftovers:
            raise CompilationPipelineError(
                "IR ops left in the lowered graph: "
                + ", ".join(f"{n.name} ({n.target})" for n in leftovers)
                + "; a maybe_inplace call hidden behind auto_functionalized means the pre-grad "
                  "functionalization did not run")
        self.selected_impls = ctx.selected_impls

    def _lower(self, graph: Graph, node: Node, op: IrOp, ctx: PassContext) -> None:
        args = ir_args(node, op)
        fake_args = tuple(fake_value(a) for a in args)
        impl = op.dispatch(*fake_args)
        ctx.selected_impls.setdefault(op.name, {})[node.name] = impl.provider
        clones = [op.param_names[i] for i in op.activation_indices] if impl.inplace else []
        ctx.note(self.name, f"{node.name}: {op.name} -> provider '{impl.provider}'"
                 + (f" (in-place; activations {clones} cloned)" if clones else ""))

        traced_at = [i for i, a in enumerate(args) if isinstance(a, Node)]
        impl_gm = self._trace(op, impl, fake_args, traced_at)
        outputs = self._inline(graph, node, impl_gm, [args[i] for i in traced_at], op, impl)

        if isinstance(node.meta.get("val"), (tuple, list)):
            if not isinstance(outputs, (tuple, list)):
                raise CompilationPipelineError(f"provider '{impl.provider}' of {op.name} returned one value "
                                               "where the op returns a tuple")
            for index, user in getitem_users(node).items():
                user.replace_all_uses_with(outputs[index])
                graph.erase_node(user)
        else:
            node.replace_all_uses_with(outputs)
        graph.erase_node(node)

    def _trace(self, op: IrOp, impl: IrOpImpl, fake_args: tuple, traced_at: list[int]) -> torch.fx.GraphModule:
        activations = set(op.activation_indices) if impl.inplace else set()

        def run(*traced):
            call = list(fake_args)
            for i, t in zip(traced_at, traced):
                call[i] = t
            for i in activations:
                call[i] = torch.ops.aten.clone.default(call[i])
            return impl.impl_fn(*call)

        inputs = [fake_args[i] for i in traced_at]
        fake_mode = detect_fake_mode(inputs)
        with (fake_mode or contextlib.nullcontext()), torch.no_grad(), preserve_node_meta(), \
                enable_python_dispatcher():
            return make_fx(run, decomposition_table=self.decompositions, tracing_mode="real")(*inputs)

    def _inline(self, graph: Graph, node: Node, impl_gm: torch.fx.GraphModule, inputs: list[Node],
                op: IrOp, impl: IrOpImpl):
        env: dict[Node, Node] = {}
        placeholders = [n for n in impl_gm.graph.nodes if n.op == "placeholder"]
        env.update(zip(placeholders, inputs))
        owner = graph.owning_module
        result = None
        with graph.inserting_before(node):
            for n in impl_gm.graph.nodes:
                if n.op == "placeholder":
                    continue
                if n.op == "output":
                    result = torch.fx.map_arg(n.args[0], env.__getitem__)
                    break
                if n.op == "get_attr":
                    env[n] = self._inline_constant(graph, owner, impl_gm, n, op, impl)
                    continue
                copied = graph.node_copy(n, env.__getitem__)
                copied.meta["lowered_from"] = (node.name, op.name, impl.provider)
                env[n] = copied
        return result

    @staticmethod
    def _inline_constant(graph: Graph, owner, impl_gm, n: Node, op: IrOp, impl: IrOpImpl) -> Node:
        value = getattr(impl_gm, n.target)
        if owner is None or isinstance(value, torch._subclasses.FakeTensor):
            raise CompilationPipelineError(
                f"provider '{impl.provider}' of {op.name} creates a tensor constant ({n.target}) while traced; "
                "build tensors from the arguments (e.g. torch.empty_like) instead")
        name = f"_reference_ir_const_{next(_constant_ids)}"
        owner.register_buffer(name, value)
        new = graph.get_attr(name)
        new.meta.update(n.meta)
        return new


def inductor_decompositions() -> dict:
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()
