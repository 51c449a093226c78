"""Platform of the 'batch_guard' fault (kernels in conformance_broken.batch_guard_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("batch_guard")
