"""Platform of the 'no_saturation' fault (kernels in conformance_broken.no_saturation_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("no_saturation", {"static_quant_fp8": ["broken", "native"]})

EXPECTED = Fault(family="numerics", outcome="FAIL", fragments=("saturated",), also_passes=True,
                 hint=("only saturated inputs (beyond the static scale's range) fail",))
