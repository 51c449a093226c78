"""Platform of the 'missing_epsilon' fault (kernels in conformance_broken.missing_epsilon_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("missing_epsilon")

EXPECTED = Fault(family="numerics", outcome="FAIL", fragments=("far beyond rounding differences",),
                 also_passes=True, end_to_end=("-k", "numerics and rms_norm and float32"), clean_too=True,
                 checked_by=("test_missing_epsilon_gets_a_cause_hint_naming_tiny_magnitudes",))
