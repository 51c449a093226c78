"""Platform of the 'batch_guard_large' fixture (kernels in conformance_broken.batch_guard_large_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("batch_guard_large")

EXPECTED = Fault(family="dispatch", outcome="FAIL", fragments=("guards on the batch size",), also_passes=True)
