"""Platform of the 'writes_weight' fault (kernels in conformance_broken.writes_weight_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("writes_weight", {"fused_add_rms_norm": ["broken", "native"]})

EXPECTED = Fault(family="aliasing", outcome="FAIL", fragments=("'weight'",))
