"""Platform of the 'loosens_tolerance' fault (kernels in conformance_broken.loosens_tolerance_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("loosens_tolerance")
