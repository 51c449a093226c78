"""Platform of the 'attn_padded_slot' fault (attention backend in conformance_broken.attn_padded_slot_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("attn_padded_slot", {}, attention=True)

EXPECTED = Fault(family="attention", outcome="FAIL", fragments=("the last, where a slot of -1 used as an index lands",), also_passes=True)
