"""Platform of the 'sampling_top_p_off_by_one' fault (its sampler in conformance_broken.sampling_top_p_off_by_one_kernels)."""

from conformance_broken.records import Fault
from conformance_broken.sampling_base import sampling_platform

Platform = sampling_platform("sampling_top_p_off_by_one")

EXPECTED = Fault(family="sampling", outcome="FAIL", fragments=("top_p=",), also_passes=True,
                 checked_by=("test_a_top_p_boundary_off_by_one_fails_in_the_mask_and_in_distribution",))
