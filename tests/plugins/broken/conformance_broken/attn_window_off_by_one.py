"""Platform of the 'attn_window_off_by_one' fault (attention backend in conformance_broken.attn_window_off_by_one_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("attn_window_off_by_one", {}, attention=True)

EXPECTED = Fault(family="attention", outcome="FAIL", fragments=("admits one key too many in the sliding window",), also_passes=True)
