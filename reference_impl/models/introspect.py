"""What a model run used: the provider IR dispatch selected per op, and the forward each CustomOp layer runs."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode


class ProviderProbe(TorchDispatchMode):
    """Records, for every IR op call seen by the torch dispatcher, the provider IR dispatch selects."""

    def __init__(self):
        super().__init__()
        self.providers: dict[str, set[str]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from reference_impl.ir.op import LIB_NAMESPACE, IrOp

        kwargs = kwargs or {}
        if func.namespace == LIB_NAMESPACE:
            op = IrOp.registry.get(func._overloadpacket.__name__)
            if op is not None:
                self.providers.setdefault(op.name, set()).add(op.dispatch(*args, **kwargs).provider)
        return func(*args, **kwargs)


def compiled_providers(backend) -> dict[str, set[str]]:
    """op -> providers the lowering of a ReferenceCompileBackend chose, over all its compilations."""
    out: dict[str, set[str]] = {}
    for ctx in backend.contexts:
        for op, nodes in ctx.selected_impls.items():
            out.setdefault(op, set()).update(nodes.values())
    return out


def custom_op_paths(model: nn.Module) -> dict[str, set[str]]:
    """CustomOp class name -> the forward methods its instances in `model` are bound to (forward_cpu, ...)."""
    from reference_impl.custom_op import CustomOp

    out: dict[str, set[str]] = {}
    for module in model.modules():
        if isinstance(module, CustomOp):
            method = getattr(module, "_forward_method", None)
            out.setdefault(type(module).__qualname__, set()).add(getattr(method, "__name__", "forward"))
    return out


def describe(mapping: dict[str, set[str]]) -> str:
    """`key: a/b, key2: c` sorted, or `none`."""
    return ", ".join(f"{k}: {'/'.join(sorted(v))}" for k, v in sorted(mapping.items())) or "none"


def probe_providers(fn, *args) -> dict[str, set[str]]:
    """Run `fn(*args)` under a ProviderProbe (no grad) and return what it recorded."""
    probe = ProviderProbe()
    with probe, torch.no_grad():
        fn(*args)
    return probe.providers
