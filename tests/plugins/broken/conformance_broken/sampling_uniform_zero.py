"""Platform of the 'sampling_uniform_zero' fault (its sampler in conformance_broken.sampling_uniform_zero_kernels)."""

from conformance_broken.records import Fault
from conformance_broken.sampling_base import sampling_platform

Platform = sampling_platform("sampling_uniform_zero")

EXPECTED = Fault(family="sampling", outcome="FAIL", fragments=("the oracle must reject",), also_passes=True,
                 checked_by=("test_a_rejection_sampler_whose_uniform_is_zero_accepts_every_draft_and_fails",))
