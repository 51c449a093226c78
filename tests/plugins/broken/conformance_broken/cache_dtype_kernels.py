"""Fault (mixed dtypes): rotary embedding that reads cos_sin_cache's bytes as the query's dtype, as a kernel
templated on the query's scalar type does; right when the cache has the query's dtype, garbage for a
float32 cache with 16-bit queries (which native, and the op's semantics, accept)."""

from conformance_broken.rotary_base import make_rotary_kernels


def _cache_as_query_dtype(positions, x, head_size, cache, neox):
    if cache.dtype == x.dtype:
        return cache, neox
    rot = cache.shape[-1]
    return cache.contiguous().view(x.dtype)[..., :rot], neox   # the bug: reinterprets, does not convert


make_rotary_kernels(_cache_as_query_dtype)
