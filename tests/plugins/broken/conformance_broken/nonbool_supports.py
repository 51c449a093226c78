"""Platform of the 'nonbool_supports' fault (kernels in conformance_broken.nonbool_supports_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("nonbool_supports")
