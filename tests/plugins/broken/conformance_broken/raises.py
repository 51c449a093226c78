"""Platform of the 'raises' fault (kernels in conformance_broken.raises_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("raises")

EXPECTED = Fault(family="numerics", outcome="ERROR", fragments=("launch failed",),
                 end_to_end=("-k", "numerics and float32 and ir_case"))
