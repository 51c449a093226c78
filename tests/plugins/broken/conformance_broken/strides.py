"""Platform of the 'strides' fault (kernels in conformance_broken.strides_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("strides")

EXPECTED = Fault(family="numerics", outcome="FAIL", fragments=("strided",), also_passes=True)
