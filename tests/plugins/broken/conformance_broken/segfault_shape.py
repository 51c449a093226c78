"""Platform of the 'segfault_shape' fault (kernels in conformance_broken.segfault_shape_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("segfault_shape", {"rotary_embedding": ["broken", "native"]})
