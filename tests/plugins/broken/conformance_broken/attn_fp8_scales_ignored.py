"""Platform of the 'attn_fp8_scales_ignored' fault (attention backend in conformance_broken.attn_fp8_scales_ignored_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("attn_fp8_scales_ignored", {}, attention=True)

EXPECTED = Fault(family="attention", outcome="FAIL", fragments=("ignores the fp8 KV-cache scales",), also_passes=True)
