"""vLLM's IR implementations, registered on the reference IR ops they share a name with.

For every `vllm.ir` op whose counterpart in `reference_impl.ir` takes the same parameters, each
vLLM implementation other than `native` becomes a provider of ours named `vllm:<provider>`, with
vLLM's own `supported` flag, `supports_args` predicate (called with the same arguments) and
`inplace` flag; its kernel is vLLM's `impl_fn`, called directly. The checks then grade it like any
provider: numerics and aliasing (the `maybe_inplace` contract included), compile, and dispatch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

PREFIX = "vllm:"


def provider_name(vllm_provider: str) -> str:
    """Our provider name for a vLLM provider (`native` stays `native`)."""
    return vllm_provider if vllm_provider == "native" else PREFIX + vllm_provider


@dataclasses.dataclass
class IrBridge:
    """What the IR bridge did: providers registered per op, and vLLM ops it could not bridge (name -> why)."""

    providers: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    not_covered: dict[str, str] = dataclasses.field(default_factory=dict)


def _kernel(vllm_impl, signature) -> Callable:
    """vLLM's impl_fn behind our op's signature (our registration compares it with native's)."""
    impl_fn = vllm_impl.impl_fn

    def kernel(*args, **kwargs):
        return impl_fn(*args, **kwargs)

    kernel.__signature__ = signature
    kernel.__name__ = kernel.__qualname__ = f"vllm_{vllm_impl.op.name}_{vllm_impl.provider}"
    kernel.__module__ = getattr(impl_fn, "__module__", __name__)
    kernel.conformance_code = impl_fn   # whose code runs (conformance.collect.origin): vLLM's or the vendor's
    return kernel


def _params(signature) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in signature.parameters.values()]


def bridge_ir() -> IrBridge:
    """Register every bridgeable vLLM IR implementation on our ops (idempotent within a process)."""
    import inspect

    from vllm.ir.op import IrOp as VllmIrOp

    from reference_impl.ir.op import IrOp

    result = IrBridge()
    for name, vop in sorted(VllmIrOp.registry.items()):
        ours = IrOp.registry.get(name)
        if ours is None:
            result.not_covered[name] = "vLLM IR op with no counterpart in the reference catalog"
            continue
        theirs = inspect.signature(vop.impls["native"].impl_fn)
        if _params(theirs) != _params(ours.signature):
            result.not_covered[name] = (f"vLLM IR op whose parameters {list(theirs.parameters)} differ from the "
                                        f"reference op's {ours.param_names}")
            continue
        for provider, impl in vop.impls.items():
            if provider == "native":
                continue
            ours_name = provider_name(provider)
            if ours_name not in ours.impls:
                ours.register_impl(ours_name, supported=bool(impl.supported), supports_args=impl._supports_args,
                                   inplace=bool(impl.inplace))(_kernel(impl, ours.signature))
            result.providers.setdefault(name, []).append(ours_name)
    return result


def map_priorities(vllm_priorities: dict[str, list[str]]) -> dict[str, list[str]]:
    """vLLM's default IR priorities in our provider names, for the ops we have; all-native lists dropped
    (an op left out runs native, the same thing)."""
    from reference_impl.ir.op import IrOp

    out = {}
    for op, providers in vllm_priorities.items():
        if op in IrOp.registry and any(p != "native" for p in providers):
            out[op] = [provider_name(p) for p in providers]
    return out
