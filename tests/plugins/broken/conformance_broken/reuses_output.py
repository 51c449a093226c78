"""Platform of the 'reuses_output' fault (kernels in conformance_broken.reuses_output_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("reuses_output", {"rms_norm": ["broken", "native"]})
