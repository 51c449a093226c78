"""Whose code an engine result under the vLLM bridge is about: the platform's (the distribution under test), or
vLLM's own (upstream of a vendor's plugin), decided from what the engine process observed, as the attention family
decides by the backend it grades (conformance/collect/origin.py: vLLM's own CPU_ATTN is upstream under a vendor's
plugin). The same vLLM defect then gates a vendor through neither family.

An ERROR: raised in the platform's code (its innermost frame among the platform's and vLLM's is the platform's): the
platform's. Raised in vLLM's code where the raise matches vLLM's contract for a platform (contracts.py): the
platform's, which broke the contract. Raised in vLLM's code called from the platform's code (a platform frame on the
stack): the platform's. Raised in vLLM's code with none of the platform's code on the stack: vLLM's (upstream,
unless vLLM's own platform is under test, whose distribution is vLLM's). A FAIL: the code that computed the model
(its attention backend, impl and builder, its CustomOps' classes and dispatched forwards, the `vllm.ir`
implementations dispatched): any of it the platform's, the platform's; all of it vLLM's, vLLM's. Anything else (a
PASS, a raise only in third-party frames, nothing observed) is the unit's default, the platform's.

The platform's code is its distribution's (the one under test, `conformance_plugin`) or its class's top-level
package (the class vLLM resolved in the engine process); vLLM's is the distribution the bridge names upstream
(`conformance_upstream`).
"""

from __future__ import annotations

from conformance.checks.engine.contracts import Contract, EngineError
from conformance.collect.origin import REFERENCE_DISTRIBUTION, Origin, code_of, distribution_of_module, is_upstream


class Whose:
    """The attribution of one platform's engine results (`platform`: the harness's platform object, duck-typed)."""

    def __init__(self, platform, platform_class: str | None):
        plugin = getattr(platform, "conformance_plugin", None) or {}
        self.under_test: str | None = plugin.get("distribution")
        self.under_test_version: str | None = plugin.get("version")
        self.upstreams = frozenset({REFERENCE_DISTRIBUTION, *(getattr(platform, "conformance_upstream", None) or ())})
        if platform_class is None:   # nothing observed: the harness's view of the platform's class
            code = code_of(getattr(platform, "conformance_code", None) or type(platform))
            platform_class = f"{code.__module__}.{code.__qualname__}"
        self.platform_class = platform_class
        self.platform_package = platform_class.split(".")[0]

    def origin(self, module: str, qualname: str) -> Origin:
        """The origin of the code `module`.`qualname`."""
        if module.split(".")[0] == self.platform_package:
            dist, version = self.under_test, self.under_test_version
        else:
            dist, version = distribution_of_module(module) or (None, None)
        return Origin(dist, version, f"{module}.{qualname}", is_upstream(dist, self.under_test, self.upstreams))

    def platform_origin(self) -> Origin:
        module, _, qualname = self.platform_class.rpartition(".")
        return self.origin(module, qualname)

    def is_platforms(self, module: str) -> bool:
        """Whether `module` is the platform's code (its class's package, or its distribution)."""
        if module.split(".")[0] == self.platform_package:
            return True
        found = distribution_of_module(module)
        return found is not None and self.under_test is not None and found[0] == self.under_test

    def is_vllms(self, module: str) -> bool:
        """Whether `module` is vLLM's code (the bridge's upstream distribution, or vLLM's own platform under test)."""
        found = distribution_of_module(module)
        dist = found[0] if found else None
        return module.split(".")[0] == "vllm" or (dist is not None and dist in self.upstreams)

    def of_error(self, error: EngineError, contract: Contract | None) -> tuple[Origin, str]:
        """The origin of an engine ERROR and the clause the message says it with."""
        ours = [f for f in error.frames if self.is_platforms(f[0])]
        theirs = [f for f in error.frames if not self.is_platforms(f[0]) and self.is_vllms(f[0])]
        deepest_ours = max((i for i, f in enumerate(error.frames) if f in ours), default=-1)
        deepest_theirs = max((i for i, f in enumerate(error.frames) if f in theirs), default=-1)
        if ours and deepest_ours > deepest_theirs:
            module, qualname = error.frames[deepest_ours]
            return self.origin(module, qualname), f"raised in the platform's code, {module}.{qualname}"
        if not theirs:
            return self.platform_origin(), "raised outside the platform's and vLLM's code"
        module, qualname = error.frames[deepest_theirs]
        where = f"raised in vLLM's code, {module}.{qualname}"
        if contract is not None:
            return self.platform_origin(), f"{where}, where the platform breaks its contract"
        if ours:
            caller = ours[-1]
            return (self.origin(*caller), f"{where}, called from the platform's code, {caller[0]}.{caller[1]}")
        origin = self.origin(module, qualname)
        if origin.upstream:
            return origin, f"{where}, with none of the platform's code on the stack (vLLM's own: upstream)"
        return origin, where

    def of_computation(self, computed: list[tuple[str, str]]) -> tuple[Origin, str]:
        """The origin of what an engine computed (a FAIL), and the clause the message says it with."""
        ours = [f for f in computed if self.is_platforms(f[0])]
        if ours:
            shown = ", ".join(f"{m}.{q}" for m, q in ours[:4]) + (f" and {len(ours) - 4} more" if len(ours) > 4 else "")
            part = "it" if len(ours) == len(computed) else "part of it"
            return self.origin(*ours[0]), f"the platform's code computed {part}: {shown}"
        if computed and all(self.is_vllms(m) for m, _ in computed):
            attention = [f for f in computed if "attention" in f[0]] or computed
            origin = self.origin(*attention[0])
            if origin.upstream:
                return origin, ("vLLM's own code computed all of it (attention backend, layers and IR "
                                "implementations): upstream")
            return origin, "vLLM's code computed all of it"
        return self.platform_origin(), "the code that computed it was not observed"
