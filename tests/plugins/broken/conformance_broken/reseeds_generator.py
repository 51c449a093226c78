"""Platform of the 'reseeds_generator' fault (kernels in conformance_broken.reseeds_generator_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("reseeds_generator")

EXPECTED = Fault(family="numerics", outcome="FAIL", fragments=("the default (CPU) generator was reseeded",),
                 end_to_end=("-k", "numerics and rms_norm and float32 and ir_case"),
                 checked_by=("test_a_kernel_that_reseeds_the_default_generator_fails_in_the_family_that_runs_it",))
