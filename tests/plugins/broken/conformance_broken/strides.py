"""Platform of the 'strides' fault (kernels in conformance_broken.strides_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("strides")
