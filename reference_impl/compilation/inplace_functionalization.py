"""Pre-grad pass: every `maybe_inplace` IR call becomes the functional overload.

Before rewriting it checks the donation contract (nothing reads a donated activation, or any
alias of it, after the call) and records which graph inputs were donated, so clone elimination
may later let an in-place kernel write into them.
"""

from __future__ import annotations

from torch.fx import Graph, Node

from reference_impl.compilation.errors import DonatedInputReuseError
from reference_impl.compilation.fx_utils import (
    describe, ir_args, ir_op_of, may_overlap, node_tensors, placeholders, positions, reads_data, source_line,
    storages,
)
from reference_impl.compilation.pass_manager import PRE_GRAD, GraphPass, PassContext


class InplaceFunctionalizationPass(GraphPass):
    name = "inplace_functionalization"
    stage = PRE_GRAD

    def __call__(self, graph: Graph, ctx: PassContext) -> None:
        order = positions(graph)
        inputs = placeholders(graph)
        input_index = {p: i for i, p in enumerate(inputs)}
        ctx.num_pre_grad_inputs = len(inputs)
        by_storage: dict = {}
        for node in graph.nodes:
            for s in storages(node):
                by_storage.setdefault(s, []).append(node)

        for node in list(graph.nodes):
            found = ir_op_of(node)
            if found is None or not found[1]:
                continue
            op, _ = found
            args = ir_args(node, op)
            seen: dict[Node, str] = {}
            for i in op.activation_indices:
                value, param = args[i], op.param_names[i]
                if not isinstance(value, Node):
                    continue
                if value in seen:
                    raise DonatedInputReuseError(
                        f"{op.name}.maybe_inplace at {describe(node)} receives {describe(value)} as both "
                        f"'{seen[value]}' and '{param}': one value cannot be donated twice; pass a "
                        ".clone() for one of them", op=op.name, value=value.name, user=node.name,
                        where=source_line(node))
                seen[value] = param
                self._check_not_reused(node, op.name, param, value, order, by_storage)
                aliases = self._aliases(value, by_storage)
                if value.op == "placeholder":
                    shared = [a for a in aliases if a is not value and a.op in ("placeholder", "get_attr")]
                    if shared:
                        ctx.note(self.name, f"input {value.name} shares storage with "
                                 f"{[a.name for a in shared]}; not treated as donated")
                    else:
                        ctx.donated_input_ids.add(input_index[value])
                        ctx.donated_input_names[input_index[value]] = value.name
            node.target = op.torch_op
            ctx.note(self.name, f"{node.name}: {op.name}.maybe_inplace -> {op.name}.default "
                     f"(donated: {[args[i].name for i in op.activation_indices if isinstance(args[i], Node)]})")

    @staticmethod
    def _aliases(value: Node, by_storage: dict) -> set[Node]:
        """Nodes whose values may overlap `value`'s memory (views of it, its base; not disjoint slices)."""
        out = {value}
        mine = node_tensors(value)
        for s in storages(value):
            for other in by_storage.get(s, ()):
                if other not in out and any(may_overlap(t, u) for t in mine for u in node_tensors(other)):
                    out.add(other)
        return out

    def _check_not_reused(self, call: Node, op_name: str, param: str, value: Node, order: dict,
                          by_storage: dict) -> None:
        here = order[call]
        for alias in sorted(self._aliases(value, by_storage), key=order.__getitem__):
            for user in sorted(alias.users, key=order.__getitem__):
                if user is call or order[user] < here or not reads_data(user):
                    continue
                through = "" if alias is value else f" through its alias {describe(alias)}"
                reader = "returned as a graph output" if user.op == "output" else f"read by {describe(user)}"
                raise DonatedInputReuseError(
                    f"{describe(value)} was donated to {op_name}.maybe_inplace (argument '{param}') at "
                    f"{describe(call)} but is {reader}{through} afterwards; an in-place implementation may "
                    f"have overwritten it. Use {op_name}(...) (functional) or pass {value.name}.clone() "
                    "to maybe_inplace.", op=op_name, value=value.name, user=user.name,
                    where=source_line(user))
