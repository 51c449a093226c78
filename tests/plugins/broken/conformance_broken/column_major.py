"""Platform of the 'column_major' fault (kernels in conformance_broken.column_major_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("column_major")

EXPECTED = Fault(family="aliasing", outcome="FAIL", fragments=("fake-tensor check", "Stride mismatch"),
                 also_passes=True)
