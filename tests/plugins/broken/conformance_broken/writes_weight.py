"""Platform of the 'writes_weight' fault (kernels in conformance_broken.writes_weight_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("writes_weight", {"fused_add_rms_norm": ["broken", "native"]})
