"""Which attention backends a platform brings: the backends its `get_attn_backend_cls` returns for the selector
configs of the attention cases, and the ones its own package registered in the backend registry (a kernel provider
may register several). The reference backend is native, never brought.

Part of collecting what a platform brings (beside `inventory.py`'s IR providers and CustomOp replacements): the
attention family's units (conformance.checks.attention.units) and the results' attribution (`origin.py`) both read
it, and collect imports nothing else of the harness.
"""

from __future__ import annotations


def selector_configs(platform):
    """(case, dtype, kv dtype, selector config) for every case and kv dtype the family may ask the platform about."""
    from reference_impl.attention.cases import CASES
    from reference_impl.ir.tolerances import ATTN_TOLERANCES

    for case in CASES:
        for dtype in platform.supported_dtypes:
            if dtype in ATTN_TOLERANCES:
                for kv in case.kv_dtypes:
                    yield case, dtype, kv, case.selector_config(dtype, kv)


def brought_backends(platform) -> list[str]:
    """The backends `platform` brings, by registry name (qualname when unregistered), in a stable order."""
    from reference_impl.attention.registry import REFERENCE_BACKEND, AttentionBackendEnum, _OVERRIDES, name_of, resolve

    seen: dict[str, None] = {}
    for case, dtype, kv, config in selector_configs(platform):
        try:
            qualname = platform.get_attn_backend_cls(None, config, case.num_heads)
            cls = resolve(qualname)
        except Exception:  # noqa: BLE001 - attention.dispatch's resolve unit reports it
            continue
        if qualname == REFERENCE_BACKEND:
            continue
        seen.setdefault(name_of(cls) or qualname, None)
    # backends the platform's own package registered (a bridged platform's is the vendor's, not the bridge's)
    package = (getattr(platform, "conformance_class", None) or type(platform).__module__).split(".")[0]
    for member in AttentionBackendEnum:
        path = _OVERRIDES.get(member.name, member.value)
        if path and path != REFERENCE_BACKEND and path.split(".")[0] == package:
            seen.setdefault(member.name, None)
    return list(seen)
