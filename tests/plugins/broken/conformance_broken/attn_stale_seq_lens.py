"""Platform of the 'attn_stale_seq_lens' fault (attention backend in conformance_broken.attn_stale_seq_lens_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("attn_stale_seq_lens", {}, attention=True)

EXPECTED = Fault(family="attention", outcome="FAIL", fragments=("the backend keeps state from an earlier step",), also_passes=True,
                 end_to_end=("-k", "attention and float32 and (steps or decode)"), clean_too=True)
