"""Platform of the 'untraceable' fault (kernels in conformance_broken.untraceable_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("untraceable")
