"""Platform of the 'hangs' fault (kernels in conformance_broken.hangs_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("hangs")

EXPECTED = Fault(family="numerics", outcome="TIMEOUT", fragments=("per-check limit of 3 s",), in_process=False,
                 end_to_end=("--conformance-timeout=3", "-k", "float32 and ir_case and 128 and not 1280 or coverage"))
