"""Platform of the 'traced_branch' fault (kernels in conformance_broken.traced_branch_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("traced_branch")

# Depending on the torch version, is_compiling() steers the trace (wrong result) or the value read
# raises a data-dependent guard while lowering (2.11): a compile FAIL either way.
EXPECTED = Fault(family="compile", outcome="FAIL",
                 fragments=("compiled result differs from eager", "branches on tensor values while traced"),
                 in_process=False, end_to_end=("-k", "rms_norm and float32 and (compile or numerics) and not fused"),
                 clean_too=True, eager_correct=True)
