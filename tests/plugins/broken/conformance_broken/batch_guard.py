"""Platform of the 'batch_guard' fault (kernels in conformance_broken.batch_guard_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("batch_guard")

EXPECTED = Fault(family="dispatch", outcome="FAIL", fragments=("guards on the batch size: False with 2 rows",),
                 also_passes=True, end_to_end=("-k", "dispatch"), clean_too=True)
