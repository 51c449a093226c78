"""Platform of the 'precise_rotary' fault (kernels in conformance_broken.precise_rotary_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("precise_rotary", {"rotary_embedding": ["broken", "native"]})
