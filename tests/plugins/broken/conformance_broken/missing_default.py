"""Fault: defaults name a provider that does not exist ('fastnorm') and one that can never be selected."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("missing_default", {"rms_norm": ["fastnorm", "broken", "native"],
                                             "fused_add_rms_norm": ["never", "native"]})

EXPECTED = Fault(family="dispatch", outcome="FAIL", fragments=("'fastnorm', which is not registered",),
                 also_passes=True)
