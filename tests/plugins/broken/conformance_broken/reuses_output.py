"""Platform of the 'reuses_output' fault (kernels in conformance_broken.reuses_output_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("reuses_output", {"rms_norm": ["broken", "native"]})

EXPECTED = Fault(family="numerics", outcome="FAIL", fragments=("returns an output buffer it reuses",),
                 also_passes=True)
