"""Platform of the 'odd_numerics' fault (kernels in conformance_broken.odd_numerics_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("odd_numerics")
