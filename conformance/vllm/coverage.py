"""What vLLM has that the bridge does not grade, by name and why: never skipped in silence.

Every `vllm.ir` op and every CustomOp / PluggableLayer name vLLM registers (its layer library
`vllm.model_executor.layers` imported, plus whatever the plugins registered), and every vendor
`register_oot` replacement, that the bridge did not turn into a graded provider or replacement.
Each becomes one `dispatch.not_covered` result (SKIP, with the reason), so it is on the scorecard's
coverage line, in the results file and in the reports; nothing is graded against a reference it
does not have.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from pathlib import Path

# unit.case of a not-covered result: what kind of vLLM thing it is
KINDS = ("ir_op", "custom_op", "pluggable_layer", "register_oot")
_NOT_BRIDGED = ("its reference counterpart {ours} is in the catalog, but the bridge does not build this vLLM layer: "
                "constructing it needs vLLM engine state (tensor-parallel groups, a forward context, model, cache "
                "or quantization config) that exists only inside a running engine")


@dataclasses.dataclass(frozen=True)
class NotCovered:
    name: str
    kind: str       # one of KINDS
    reason: str


def layer_modules() -> list[str]:
    """The modules of vLLM's layer library whose source registers a CustomOp or PluggableLayer."""
    import vllm.model_executor.layers as layers

    root = Path(layers.__file__).parent
    out = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(errors="ignore")
        if "CustomOp.register(" in text or "PluggableLayer.register(" in text:
            rel = path.relative_to(root).with_suffix("")
            out.append(".".join((layers.__name__, *rel.parts)))
    return out


@functools.cache
def import_layer_library() -> dict[str, str]:
    """Import those modules (once per process); module -> error line for those that fail to import."""
    failed = {}
    for module in layer_modules():
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - listed as not covered, with the cause
            failed[module] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return failed


def not_covered(ir_not_covered: dict[str, str], replaced: dict[str, type]) -> list[NotCovered]:
    """Everything vLLM registers that the bridge does not grade, sorted by kind and name."""
    from vllm.model_executor.custom_op import CustomOp as VllmCustomOp
    from vllm.model_executor.custom_op import op_registry, op_registry_oot

    from reference_impl.custom_op import CustomOp

    failed = import_layer_library()
    out = [NotCovered(name, "ir_op", why) for name, why in ir_not_covered.items()]
    for name, cls in op_registry.items():
        if name in replaced:
            continue
        kind = "custom_op" if issubclass(cls, VllmCustomOp) else "pluggable_layer"
        ours = CustomOp.op_registry.get(name)
        why = (_NOT_BRIDGED.format(ours=ours.__name__) if ours is not None
               else f"vLLM {kind.replace('_', ' ')} {cls.__module__}.{cls.__qualname__} has no counterpart in the "
                    "reference catalog")
        out.append(NotCovered(name, kind, why))
    bridged_classes = {rep.vllm_class.__name__ for rep in replaced.values()}
    for key, rep in op_registry_oot.items():
        if key not in bridged_classes:
            out.append(NotCovered(key, "register_oot",
                                  f"register_oot replacement {rep.__module__}.{rep.__qualname__} of vLLM class {key}, "
                                  "which the bridge does not build, so the replacement is not graded"))
    for module, error in failed.items():
        out.append(NotCovered(module, "custom_op", f"vLLM layer module that does not import here ({error}): the "
                                                   "layers it registers are unknown"))
    return sorted(out, key=lambda n: (KINDS.index(n.kind), n.name))
