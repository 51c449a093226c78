"""Platform of the 'precise_rotary' fault (kernels in conformance_broken.precise_rotary_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Control

Platform = make_platform("precise_rotary", {"rotary_embedding": ["broken", "native"]})

EXPECTED = Control(family="numerics", dtypes=("float16", "bfloat16"), level="standard",
                   checked_by=("test_a_kernel_closer_to_float64_than_native_passes_where_native_is_the_less_precise",))
