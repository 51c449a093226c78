"""Platform of the 'hangs' fault (kernels in conformance_broken.hangs_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("hangs")
