"""Platform of the 'batch_guard_large' fixture (kernels in conformance_broken.batch_guard_large_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("batch_guard_large")
