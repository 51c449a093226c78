"""Platform of the 'no_epsilon' fault (kernels in conformance_broken.no_epsilon_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("no_epsilon")
