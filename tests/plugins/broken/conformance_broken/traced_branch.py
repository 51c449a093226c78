"""Platform of the 'traced_branch' fault (kernels in conformance_broken.traced_branch_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("traced_branch")
