"""Platform of the 'refuses_tail' fault (kernels in conformance_broken.refuses_tail_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("refuses_tail", {"rms_norm": ["broken", "native"]})
