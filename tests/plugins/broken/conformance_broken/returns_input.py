"""Platform of the 'returns_input' fault (kernels in conformance_broken.returns_input_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("returns_input")

EXPECTED = Fault(family="aliasing", outcome="FAIL", fragments=("shares storage with input 'x'",))
