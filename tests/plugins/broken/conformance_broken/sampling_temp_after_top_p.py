"""Platform of the 'sampling_temp_after_top_p' fault (its sampler in conformance_broken.sampling_temp_after_top_p_kernels)."""

from conformance_broken.records import Fault
from conformance_broken.sampling_base import sampling_platform

Platform = sampling_platform("sampling_temp_after_top_p")

EXPECTED = Fault(family="sampling", outcome="FAIL", fragments=("temperature=",), also_passes=True,
                 checked_by=("test_temperature_after_top_p_fails_naming_the_request_and_its_temperature",))
