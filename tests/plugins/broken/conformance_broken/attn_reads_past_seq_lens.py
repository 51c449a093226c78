"""Platform of the 'attn_reads_past_seq_lens' fault (attention backend in conformance_broken.attn_reads_past_seq_lens_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("attn_reads_past_seq_lens", {}, attention=True)

EXPECTED = Fault(family="attention", outcome="FAIL", fragments=("the backend reads keys past seq_lens[i]",), also_passes=True)
