"""Which attention backends a platform brings, and the `attention` family's units over them.

Which backends a platform brings is collected by conformance.collect.attention (`brought_backends`: what its
`get_attn_backend_cls` returns for the cases' selector configs, and what its own package registered). The
reference backend is native: a platform that only returns it brings nothing (one NOT_IMPLEMENTED unit per
check). Unit = op "attention", provider = backend (registry name, or qualname when unregistered), dtype,
case (`<case>` or `<case>+<kv_cache_dtype>`).
"""

from __future__ import annotations

from conformance.collect.attention import brought_backends
from conformance.collect.units import Unit, dtype_name

OP = "attention"
NONE = "none"             # the provider of the one unit per check when the platform brings no backend


def split_case(case: str) -> tuple[str, str]:
    """(case name, kv_cache_dtype) of a unit's case field."""
    name, _, kv = case.partition("+")
    return name, kv or "auto"


def join_case(name: str, kv_cache_dtype: str) -> str:
    return name if kv_cache_dtype == "auto" else f"{name}+{kv_cache_dtype}"


def backend_dtypes(platform, backend) -> list:
    from reference_impl.ir.tolerances import ATTN_TOLERANCES

    return [d for d in platform.supported_dtypes if d in ATTN_TOLERANCES and backend.supports_dtype(d)]


def _per_backend(inventory, family, check, make):
    from reference_impl.attention.registry import resolve

    names = brought_backends(inventory.platform)
    if not names:
        return [Unit(family, check, OP, NONE)]
    units = []
    for name in names:
        try:
            backend = resolve(name)
        except Exception:  # noqa: BLE001 - one unit that reports why
            units.append(Unit(family, check, OP, name))
            continue
        units += make(name, backend)
    return units


def declared_block(backend, case):
    """The case at a block size the backend declares (its preferred one) when the case's is not, as vLLM's runner
    picks a kernel block size the backend supports: a case grades its batch mix and features, which do not
    depend on the block size (vLLM's CPU backend declares MultipleOf(32); most cases use 16). Shared prefix blocks
    become as many of the larger blocks as are context of both requests; with none the case keeps its own block
    size (and is not admitted)."""
    import dataclasses

    if backend.supports_block_size(case.block_size):
        return case
    block = backend.get_preferred_block_size(case.block_size)
    if not case.shared_prefix_blocks:
        return dataclasses.replace(case, block_size=block)
    shared = min(case.shared_prefix_blocks, min(case.seq_lens[i] - case.query_lens[i] for i in (0, 1)) // block)
    return dataclasses.replace(case, block_size=block, shared_prefix_blocks=shared) if shared else case


def _admitted(backend, case, dtype, kv) -> bool:
    from reference_impl.attention.cases import admits

    return backend.supports_kv_cache_dtype(kv) and not admits(backend, declared_block(backend, case), dtype, kv)


def _case_units(inventory, family, check, level, names=None):
    from reference_impl.attention.cases import CASES_BY_NAME, case_dtypes, cases_at

    def make(name, backend):
        cases = cases_at(level) if names is None else [CASES_BY_NAME[n] for n in names(level)]
        dtypes = backend_dtypes(inventory.platform, backend)
        return [Unit(family, check, OP, name, dtype_name(d), join_case(c.name, kv))
                for d in dtypes for c in cases for kv in c.kv_dtypes
                if d in case_dtypes(c, dtypes) and _admitted(backend, c, d, kv)]

    return _per_backend(inventory, family, check, make)


def forward_units(inventory, family, check, level):
    """Every case at `level` x dtype x kv dtype the backend declares, and the level's drawn cases per dtype (every
    other one with an fp8 cache the backend declares)."""
    from reference_impl.attention.cases import DRAWN, DRAWN_PREFIX

    def drawn(name, backend):
        fp8 = [k for k in ("fp8_e4m3", "fp8_e5m2") if backend.supports_kv_cache_dtype(k)]
        return [Unit(family, check, OP, name, dtype_name(d),
                     join_case(f"{DRAWN_PREFIX}{i}", fp8[i // 2 % len(fp8)] if i % 2 and fp8 else "auto"))
                for d in backend_dtypes(inventory.platform, backend) for i in range(DRAWN.get(level, 0))]

    units = _case_units(inventory, family, check, level)
    extra = _per_backend(inventory, family, check, drawn)
    return units + [u for u in extra if u.provider != NONE]


CACHE_WRITE_CASES = {"quick": ("decode", "chunked_prefill"),
                     "standard": ("decode", "chunked_prefill", "shared_prefix", "blocks_past_65535")}
ALIASING_CASES = {"quick": ("chunked_prefill",), "standard": ("chunked_prefill", "fused_qkv_views", "decode")}


def cache_write_units(inventory, family, check, level):
    return _case_units(inventory, family, check, level, lambda lv: CACHE_WRITE_CASES.get(lv, CACHE_WRITE_CASES["standard"]))


def aliasing_units(inventory, family, check, level):
    return _case_units(inventory, family, check, level, lambda lv: ALIASING_CASES.get(lv, ALIASING_CASES["standard"]))


def steps_units(inventory, family, check, level):
    """Per dtype: the step sequence with an "auto" cache, and (standard and full) with each declared fp8 cache."""
    from reference_impl.attention.backend import FP8_KV_DTYPES

    def make(name, backend):
        kvs = ["auto"] + ([k for k in ("fp8_e4m3", "fp8_e5m2") if backend.supports_kv_cache_dtype(k)]
                          if level != "quick" else [])
        assert set(kvs) - {"auto"} <= set(FP8_KV_DTYPES)
        return [Unit(family, check, OP, name, dtype_name(d), join_case("steps", kv))
                for d in backend_dtypes(inventory.platform, backend) for kv in kvs]

    return _per_backend(inventory, family, check, make)


def dispatch_units(inventory, family, check, level):
    """Per backend: the selection itself ("resolve") and one probe per capability (reference_impl.attention.probes)."""
    from reference_impl.attention.cases import PROBES

    resolve = [Unit(family, check, OP, None, None, "resolve")]
    if not brought_backends(inventory.platform):
        return resolve
    return resolve + _per_backend(inventory, family, check,
                                  lambda name, backend: [Unit(family, check, OP, name, None, probe) for probe in PROBES
                                                         if PROBES[probe].applies(inventory.platform)])


def compile_units(inventory, family, check, level):
    """Per backend and dtype (quick: the first dtype only), an "auto" cache."""
    def make(name, backend):
        dtypes = backend_dtypes(inventory.platform, backend)
        return [Unit(family, check, OP, name, dtype_name(d), "compile") for d in (dtypes[:1] if level == "quick"
                                                                                  else dtypes)]

    return _per_backend(inventory, family, check, make)
