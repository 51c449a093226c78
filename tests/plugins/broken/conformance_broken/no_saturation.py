"""Platform of the 'no_saturation' fault (kernels in conformance_broken.no_saturation_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("no_saturation", {"static_quant_fp8": ["broken", "native"]})
