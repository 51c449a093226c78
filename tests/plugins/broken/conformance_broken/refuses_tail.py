"""Platform of the 'refuses_tail' fault (kernels in conformance_broken.refuses_tail_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("refuses_tail", {"rms_norm": ["broken", "native"]})

EXPECTED = Fault(family="numerics", outcome="ERROR", fragments=("decline these arguments in `supports_args`",),
                 also_passes=True, hint=("only odd sizes raise", "decline these arguments in `supports_args`"),
                 checked_by=("test_cause_hints_follow_what_the_op_does_and_which_argument_values_fail",))
