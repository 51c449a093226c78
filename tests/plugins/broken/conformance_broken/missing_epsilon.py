"""Platform of the 'missing_epsilon' fault (kernels in conformance_broken.missing_epsilon_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("missing_epsilon")
