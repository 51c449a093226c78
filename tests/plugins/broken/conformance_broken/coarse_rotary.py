"""Platform of the 'coarse_rotary' fault (kernels in conformance_broken.coarse_rotary_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("coarse_rotary", {"rotary_embedding": ["broken", "native"]})

EXPECTED = Fault(family="numerics", outcome="FAIL", fragments=("large",), also_passes=True, dtype="float16",
                 level="standard", checked_by=("test_a_kernel_further_from_float64_than_native_fails_and_says_so",))
