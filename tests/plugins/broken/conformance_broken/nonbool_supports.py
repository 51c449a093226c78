"""Platform of the 'nonbool_supports' fault (kernels in conformance_broken.nonbool_supports_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("nonbool_supports")

EXPECTED = Fault(family="dispatch", outcome="FAIL", fragments=("not a Python bool",))
