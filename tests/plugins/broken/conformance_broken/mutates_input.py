"""Platform of the 'mutates_input' fault (kernels in conformance_broken.mutates_input_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("mutates_input")
