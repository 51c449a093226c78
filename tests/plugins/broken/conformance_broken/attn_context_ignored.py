"""Platform of the 'attn_context_ignored' fault (attention backend in conformance_broken.attn_context_ignored_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("attn_context_ignored", {}, attention=True)

EXPECTED = Fault(family="attention", outcome="FAIL", fragments=("ignores the context of chunked-prefill requests",), also_passes=True)
