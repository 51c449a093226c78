"""Platform of the 'ignores_neox' fault (kernels in conformance_broken.ignores_neox_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("ignores_neox", {"rotary_embedding": ["broken", "native"]})
