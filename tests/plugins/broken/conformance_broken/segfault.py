"""Platform of the 'segfault' fault (kernels in conformance_broken.segfault_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("segfault")
