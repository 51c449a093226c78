"""Platform of the 'segfault' fault (kernels in conformance_broken.segfault_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("segfault")

EXPECTED = Fault(family="numerics", outcome="CRASH", fragments=("SIGSEGV",), in_process=False,
                 end_to_end=("-k", "float32 and ir_case and 128 and not 1280 or coverage"))
