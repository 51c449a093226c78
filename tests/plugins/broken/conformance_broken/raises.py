"""Platform of the 'raises' fault (kernels in conformance_broken.raises_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("raises")
