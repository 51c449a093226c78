"""Post-grad clone elimination: drop the clones whose removal nobody can observe.

A clone `c = clone(v)` is removed (its readers use `v`) only when all of these hold:
- the clone keeps `v`'s layout (same dtype, shape and strides), so consumers see the same tensor;
- `v`'s storage belongs to no graph input other than donated ones, and to no constant: it was
  created in the graph, or it is a graph input donated through `maybe_inplace`;
- nothing reads `v` or any alias of it after the clone (the graph output counts as a reader).
Then any mutation a consumer makes through `v` lands in memory that no one looks at again.
"""

from __future__ import annotations

import torch
from torch.fx import Graph, Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from reference_impl.compilation.fx_utils import may_overlap, node_tensors, placeholders, positions, reads_data, storages
from reference_impl.compilation.pass_manager import POST_GRAD, GraphPass, PassContext

_CLONE = torch.ops.aten.clone.default


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, device, shape and strides, decided without adding shape guards."""
    if a.dtype != b.dtype or a.device != b.device or a.dim() != b.dim():
        return False
    pairs = list(zip(a.shape, b.shape)) + list(zip(a.stride(), b.stride()))
    return all(statically_known_true(x == y) for x, y in pairs)


class _AliasSets:
    """Union-find over storages, so values merged by an earlier removal stay aliases."""

    def __init__(self, graph: Graph):
        self.parent: dict = {}
        self.members: dict = {}
        self.keys: dict[Node, set] = {}
        for node in graph.nodes:
            keys = storages(node)
            self.keys[node] = keys
            for k in keys:
                self.parent.setdefault(k, k)
                self.members.setdefault(k, set()).add(node)

    def find(self, k):
        while self.parent[k] is not k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def aliases(self, node: Node) -> set[Node]:
        """Nodes that may share memory with `node`: same merged storage class and, within one raw
        storage, not provably disjoint (q/k/v slices of one buffer are not aliases of each other)."""
        own = self.keys.get(node, set())
        roots = {self.find(k) for k in own}
        mine = node_tensors(node)
        out = {node}
        for k, nodes in self.members.items():
            if self.find(k) not in roots:
                continue
            for other in nodes:
                if other in out:
                    continue
                if k not in own or any(may_overlap(t, u) for t in mine for u in node_tensors(other)):
                    out.add(other)
        return out

    def merge(self, a: Node, b: Node) -> None:
        keys = [self.find(k) for k in self.keys.get(a, set()) | self.keys.get(b, set())]
        for k in keys[1:]:
            self.parent[k] = keys[0]


class CloneEliminationPass(GraphPass):
    name = "clone_elimination"
    stage = POST_GRAD

    def __call__(self, graph: Graph, ctx: PassContext) -> None:
        inputs = placeholders(graph)
        donated = {inputs[i] for i in (ctx.donated_post_grad_ids or ()) if i < len(inputs)}
        order = positions(graph)
        alias_sets = _AliasSets(graph)
        for clone in list(graph.nodes):
            if clone.op != "call_function" or clone.target is not _CLONE:
                continue
            source = clone.args[0]
            reason = self._keep_reason(clone, source, donated, order, alias_sets)
            if reason:
                ctx.note(self.name, f"kept {clone.name} = clone({source.name}): {reason}")
                continue
            clone.replace_all_uses_with(source)
            alias_sets.merge(source, clone)
            graph.erase_node(clone)
            ctx.note(self.name, f"removed {clone.name} = clone({source.name})")

    @staticmethod
    def _keep_reason(clone: Node, source: Node, donated: set[Node], order: dict, alias_sets: _AliasSets) -> str | None:
        if clone.kwargs.get("memory_format", torch.preserve_format) is not torch.preserve_format:
            return "it changes the memory format"
        src, dst = node_tensors(source), node_tensors(clone)
        if len(src) != 1 or len(dst) != 1 or not alias_sets.keys.get(source):
            return f"no fake tensor metadata for {source.name}"
        if not same_layout(src[0], dst[0]):
            return f"it changes the layout of {source.name} (strides {tuple(src[0].stride())})"
        aliases = alias_sets.aliases(source)
        constants = sorted(a.name for a in aliases if a.op == "get_attr")
        if constants:
            return f"{source.name} aliases the constant {constants[0]}"
        kept_inputs = sorted(a.name for a in aliases if a.op == "placeholder" and a not in donated)
        if kept_inputs:
            return f"graph input {kept_inputs[0]} is not donated"
        for alias in sorted(aliases, key=order.__getitem__):
            for user in alias.users:
                if user is not clone and order[user] > order[clone] and reads_data(user):
                    what = "returned" if user.op == "output" else f"read by {user.name}"
                    via = "" if alias is source else f" (through alias {alias.name})"
                    return f"{source.name} is {what} after the clone{via}"
        return None
