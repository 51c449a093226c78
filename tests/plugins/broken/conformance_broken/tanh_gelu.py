"""Platform of the 'tanh_gelu' fault (kernels in conformance_broken.tanh_gelu_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("tanh_gelu", {"gelu_and_mul": ["broken", "native"]})
