"""Platform of the 'attn_sinks_ignored' fault (attention backend in conformance_broken.attn_sinks_ignored_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("attn_sinks_ignored", {}, attention=True)

EXPECTED = Fault(family="attention", outcome="FAIL", fragments=("ignores the attention sinks",), also_passes=True)
