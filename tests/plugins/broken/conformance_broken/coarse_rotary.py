"""Platform of the 'coarse_rotary' fault (kernels in conformance_broken.coarse_rotary_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("coarse_rotary", {"rotary_embedding": ["broken", "native"]})
