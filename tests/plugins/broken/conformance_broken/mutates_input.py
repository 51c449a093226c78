"""Platform of the 'mutates_input' fault (kernels in conformance_broken.mutates_input_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("mutates_input")

EXPECTED = Fault(family="aliasing", outcome="FAIL", fragments=("input 'x' was modified",),
                 end_to_end=("-k", "float32 and ir_case and not compile"), clean_too=True, eager_correct=True)
