"""Whose code a result graded: the distribution that defines the function or class that ran, and whether
that is the distribution under test or upstream code (the runtime the plugin plugs into).

A result's `origin` (docs/results-file.md) is `{"distribution", "version", "code", "upstream"}`. `code` is
the module-qualified name of what the check called: a provider's `impl_fn`, or the class a `register_oot`
replacement builds. A bridge points at the object it translates through a `conformance_code` attribute (vLLM's
`impl_fn`, the class vLLM's `CustomOp.__new__` builds), so the vendor's module is named, not the bridge's.
The module's distribution comes from `importlib.metadata`: the modules each distribution's files hold (as
`packages_distributions()` finds them), and the modules the distributions' entry points name (a plugin installed
without a file list, as a `*.dist-info` next to its package, is still found). `is_upstream` is the one rule the
verdict's gate follows.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from email.parser import HeaderParser
from typing import Any

# the reference harness's own distribution: its native code is upstream for a plugin written against it
REFERENCE_DISTRIBUTION = "reference-impl-conformance"


@dataclasses.dataclass(frozen=True)
class Origin:
    distribution: str | None     # None: the defining module belongs to no installed distribution we can find
    version: str | None
    code: str | None             # module.qualname of the function or class that ran
    upstream: bool

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def is_upstream(distribution: str | None, under_test: str | None, upstreams: Iterable[str]) -> bool:
    """Upstream code: defined by a known upstream runtime's distribution (vLLM's, the reference's) that is not the
    distribution under test. Unknown code, and third-party code a plugin registers as its own, stay under test."""
    return distribution is not None and distribution != under_test and distribution in set(upstreams)


@functools.cache
def _module_distributions() -> dict[str, tuple[str, str]]:
    """Top-level module -> (distribution, version): the modules a distribution's files hold (what
    `packages_distributions()` finds), else the modules its entry points name. One pass, reading each distribution's
    metadata headers once (`packages_distributions()` and `.version` would parse all of it several times: about half
    a second a run with vLLM's 160 distributions installed); the first distribution found wins, as there."""
    from importlib.metadata import distributions

    from_files: dict[str, tuple[str, str]] = {}
    from_entry_points: dict[str, tuple[str, str]] = {}
    for dist in distributions():
        headers = HeaderParser().parsestr(dist.read_text("METADATA") or dist.read_text("PKG-INFO") or "")
        name, version = headers["Name"], headers["Version"]
        if not name:
            continue
        for module in _top_level_modules(dist):
            from_files.setdefault(module, (name, version))
        for ep in dist.entry_points:
            module = ep.value.split(":")[0].strip().split(".")[0]
            if module:
                from_entry_points.setdefault(module, (name, version))
    return {**from_entry_points, **from_files}


def _top_level_modules(dist) -> set[str]:
    """The top-level modules a distribution installs, as `packages_distributions()` reads them: its top_level.txt,
    else the first part of the path of each Python file it lists (a single-file module by its stem)."""
    declared = (dist.read_text("top_level.txt") or "").split()
    if declared:
        return set(declared)
    return {f.parts[0] if len(f.parts) > 1 else f.stem for f in dist.files or () if f.suffix == ".py"}


def distribution_of_module(module: str | None) -> tuple[str, str] | None:
    """(distribution, version) that provides `module` (dotted name), or None."""
    if not module:
        return None
    return _module_distributions().get(module.split(".")[0])


def code_of(obj: Any) -> Any:
    """What runs behind `obj`: the object a bridge names in `conformance_code`, else `obj` itself."""
    seen = 0
    while getattr(obj, "conformance_code", None) is not None and seen < 4:
        obj = obj.conformance_code
        seen += 1
    return obj


def code_name(obj: Any) -> str | None:
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    return f"{module}.{qualname}" if module and qualname else None


class Attribution:
    """The origins of what one activated platform brings, keyed as its results are (op and provider)."""

    def __init__(self, under_test: str | None, upstreams: Iterable[str], platform_code: Any = None):
        self.under_test = under_test
        self.upstreams = frozenset(upstreams)
        self.platform = self.origin(platform_code) if platform_code is not None else None
        self.ir: dict[tuple[str, str], Origin] = {}
        self.layers: dict[str, Origin] = {}        # provider (the replacement's qualname) -> origin
        self.attention: dict[str, Origin] = {}     # attention backend (the unit's provider) -> origin

    def origin(self, obj: Any) -> Origin:
        code = code_of(obj)
        found = distribution_of_module(getattr(code, "__module__", None))
        dist, version = found if found else (None, None)
        return Origin(dist, version, code_name(code), is_upstream(dist, self.under_test, self.upstreams))

    def of_result(self, op: str | None, provider: str | None, family: str) -> Origin | None:
        """The origin of a result's code: its IR provider's, its layer replacement's, or for a platform-wide
        check (the model, the engine, a default naming a provider nobody registered) the platform's; None where no
        code of anyone ran (an op left to native, a name nobody can grade)."""
        if provider is not None and op is not None and (op, provider) in self.ir:
            return self.ir[(op, provider)]
        if provider is not None and provider in self.layers:
            return self.layers[provider]
        if op == "attention" and provider in self.attention:
            return self.attention[provider]
        if provider is not None or family in ("model", "engine"):   # the platform's whole path: its own code
            return self.platform
        return None


def attribution(inventory) -> Attribution:
    """The Attribution of an activated inventory (conformance.collect.inventory)."""
    platform = inventory.platform
    under_test = (inventory_plugin(inventory) or {}).get("distribution")
    platform_code = getattr(platform, "conformance_code", None) or type(platform)
    if under_test is None:   # a built-in platform: its own distribution is under test
        found = distribution_of_module(code_of(platform_code).__module__)
        under_test = found[0] if found else None
    upstreams = {REFERENCE_DISTRIBUTION, *getattr(platform, "conformance_upstream", ())}
    table = Attribution(under_test, upstreams, platform_code)
    for op in inventory.ir_ops():
        for provider in inventory.ir_providers.get(op.name, []):
            table.ir[(op.name, provider)] = table.origin(op.impls[provider].impl_fn)
    for rep in inventory.oot.values():
        table.layers[rep.__qualname__] = table.origin(rep)
    table.attention = _attention_origins(table, platform)
    return table


def _attention_origins(table: Attribution, platform) -> dict[str, Origin]:
    """The origin of each attention backend the platform brings (a bridge's adapter names vLLM's class in its
    `conformance_code`), so a bridged plugin's results for vLLM's own backend are upstream."""
    from conformance.collect.attention import brought_backends
    from reference_impl.attention.registry import resolve

    out = {}
    for name in brought_backends(platform):
        try:
            out[name] = table.origin(resolve(name))
        except Exception:  # noqa: BLE001 - an unresolvable backend: its dispatch unit reports it
            continue
    return out


def inventory_plugin(inventory) -> dict[str, str] | None:
    """{"distribution", "version"} under test, as the results file's environment.plugin records it."""
    bridged = getattr(inventory.platform, "conformance_plugin", None)
    if bridged:
        return dict(bridged)
    from reference_impl.plugins import platform_distribution

    return platform_distribution(inventory.name)
