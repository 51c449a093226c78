"""Platform of the 'caches_per_signature' fault (kernels in conformance_broken.caches_per_signature_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("caches_per_signature", {"rms_norm": ["broken", "native"]})

EXPECTED = Fault(family="numerics", outcome="FAIL", fragments=("caches its result per signature",),
                 also_passes=True)
