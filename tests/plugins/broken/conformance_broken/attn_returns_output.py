"""Platform of the 'attn_returns_output' fault (attention backend in conformance_broken.attn_returns_output_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("attn_returns_output", {}, attention=True)

EXPECTED = Fault(family="attention", outcome="FAIL", fragments=("forward returned its result in another tensor and left `output` unwritten",), also_passes=True)
