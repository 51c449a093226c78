"""Post-grad fusion passes on the high-level IR: one simple pattern per op pair.

`RmsNormQuantFusionPass` rewrites `rms_norm -> static_quant_fp8` into `rms_norm_static_fp8_quant`
and `fused_add_rms_norm[0] -> static_quant_fp8` into `fused_add_rms_norm_static_fp8_quant`, when
the normalized value has no other reader. Matching runs before lowering, so it sees IR ops
whatever providers are selected later.
"""

from __future__ import annotations

import dataclasses
import operator

from torch.fx import Graph, Node

from reference_impl import ir
from reference_impl.compilation.fx_utils import getitem_users, ir_args, ir_op_of, positions
from reference_impl.compilation.pass_manager import POST_GRAD, GraphPass, PassContext
from reference_impl.ir.op import IrOp


@dataclasses.dataclass(frozen=True)
class ProducerConsumerPattern:
    """`consumer(producer(...)[output_index], ...)` -> `fused(...)`; fused args are taken by name,
    the producer's winning over the consumer's (the consumer's first argument is the fused value)."""

    producer: IrOp
    consumer: IrOp
    fused: IrOp
    output_index: int | None = None     # None: the producer returns one tensor


def default_patterns() -> list[ProducerConsumerPattern]:
    return [
        ProducerConsumerPattern(ir.ops.rms_norm, ir.ops.static_quant_fp8, ir.ops.rms_norm_static_fp8_quant),
        ProducerConsumerPattern(ir.ops.fused_add_rms_norm, ir.ops.static_quant_fp8,
                                ir.ops.fused_add_rms_norm_static_fp8_quant, output_index=0),
    ]


class RmsNormQuantFusionPass(GraphPass):
    name = "rms_norm_quant_fusion"
    stage = POST_GRAD

    def __init__(self, patterns: list[ProducerConsumerPattern] | None = None):
        self.patterns = patterns if patterns is not None else default_patterns()

    def __call__(self, graph: Graph, ctx: PassContext) -> None:
        for node in list(graph.nodes):
            found = ir_op_of(node)
            if found is None or found[1]:
                continue
            for pattern in self.patterns:
                if found[0] is pattern.consumer and self._try_fuse(graph, node, pattern, ctx):
                    break

    def _try_fuse(self, graph: Graph, consumer: Node, pattern: ProducerConsumerPattern, ctx: PassContext) -> bool:
        consumer_args = ir_args(consumer, pattern.consumer)
        value = consumer_args[0]
        if not isinstance(value, Node) or len(value.users) != 1:
            return False
        if pattern.output_index is None:
            producer = value
        else:
            if value.target is not operator.getitem or value.args[1] != pattern.output_index:
                return False
            producer = value.args[0]
        found = ir_op_of(producer) if isinstance(producer, Node) else None
        if found is None or found != (pattern.producer, False):
            return False

        by_name = dict(zip(pattern.consumer.param_names[1:], consumer_args[1:]))
        by_name.update(zip(pattern.producer.param_names, ir_args(producer, pattern.producer)))
        fused_args = tuple(by_name[n] for n in pattern.fused.param_names)

        # Insert after the producer and every fused argument, before every reader of a replaced value.
        order = positions(graph)
        anchor = max([producer, *(a for a in fused_args if isinstance(a, Node))], key=order.__getitem__)
        others = {} if pattern.output_index is None else {
            i: u for i, u in getitem_users(producer).items() if i != pattern.output_index}
        readers = list(consumer.users) + [u for g in others.values() for u in g.users]
        if any(order[r] <= order[anchor] for r in readers):
            ctx.note(self.name, f"{consumer.name}: not fused, a reader of {producer.name} comes before "
                     f"{anchor.name}")
            return False

        with graph.inserting_after(anchor):
            fused = graph.call_function(pattern.fused.torch_op, fused_args)
        if pattern.output_index is None:
            fused.meta["val"] = consumer.meta.get("val")
            consumer.replace_all_uses_with(fused)
        else:
            vals = list(producer.meta["val"])
            vals[pattern.output_index] = consumer.meta.get("val")
            fused.meta["val"] = tuple(vals)
            with graph.inserting_after(fused):
                outputs = {i: graph.call_function(operator.getitem, (fused, i)) for i in range(len(vals))}
            for i, out in outputs.items():
                out.meta["val"] = vals[i]
            consumer.replace_all_uses_with(outputs[pattern.output_index])
            for i, old in others.items():
                old.replace_all_uses_with(outputs[i])
                graph.erase_node(old)
            for out in list(outputs.values()):
                if not out.users:
                    graph.erase_node(out)
        graph.erase_node(consumer)
        if value is not producer:
            graph.erase_node(value)
        graph.erase_node(producer)
        ctx.note(self.name, f"{producer.name} -> {consumer.name} fused into {fused.name} "
                 f"({pattern.fused.name})")
        return True
