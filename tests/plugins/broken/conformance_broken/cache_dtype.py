"""Platform of the 'cache_dtype' fault (kernels in conformance_broken.cache_dtype_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("cache_dtype", {"rotary_embedding": ["broken", "native"]})

EXPECTED = Fault(family="numerics", outcome="FAIL", fragments=("cache=float32",), also_passes=True,
                 dtype="bfloat16", level="standard", hint=("only cases with a float32 cos_sin_cache fail",))
