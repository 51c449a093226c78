"""Platform of the 'attn_gqa_modulo' fault (attention backend in conformance_broken.attn_gqa_modulo_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("attn_gqa_modulo", {}, attention=True)

EXPECTED = Fault(family="attention", outcome="FAIL", fragments=("maps query heads to kv heads by modulo",), also_passes=True)
