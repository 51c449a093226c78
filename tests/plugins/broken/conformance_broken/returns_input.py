"""Platform of the 'returns_input' fault (kernels in conformance_broken.returns_input_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("returns_input")
