"""Platform of the 'caches_per_signature' fault (kernels in conformance_broken.caches_per_signature_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("caches_per_signature", {"rms_norm": ["broken", "native"]})
