"""Platform of the 'contiguous_only' fixture (kernels in conformance_broken.contiguous_only_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("contiguous_only")
