"""What a CustomOp dispatcher built for a replaced layer: the record the dispatch family inspects.

It lives in `collect` because both sides build it: the reference CustomOp's dispatch
(`conformance.checks.oot.reference_target`) and vLLM's, seen through the bridge
(`conformance.vllm.layer_bridge.vllm_dispatch`), and the bridge must not import the checks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class DispatchTarget:
    """What a CustomOp dispatcher built for a replaced layer and which forward it picked (custom ops on)."""

    layer: Any                  # the instance the dispatcher's CustomOp.__new__ built
    in_tree: type               # the class the replacement replaces, in that dispatcher's registry
    method: Callable            # the bound forward its dispatch_forward picked for this platform
    platform_method: str        # what the base dispatch_forward picks here when enabled: forward_oot on an OOT platform
    dispatcher: str             # whose dispatch it is, for messages: "vLLM", "the reference CustomOp"
    upstream: tuple[str, ...]   # module prefixes of code that is not the vendor's
    enabled: bool               # what the built class's enabled() (or enforce_enable) says with custom ops on
