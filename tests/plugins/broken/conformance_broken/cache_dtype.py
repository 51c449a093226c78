"""Platform of the 'cache_dtype' fault (kernels in conformance_broken.cache_dtype_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("cache_dtype", {"rotary_embedding": ["broken", "native"]})
