"""Platform of the 'attn_softcap_ignored' fault (attention backend in conformance_broken.attn_softcap_ignored_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("attn_softcap_ignored", {}, attention=True)

EXPECTED = Fault(family="attention", outcome="FAIL", fragments=("ignores logits_soft_cap",), also_passes=True)
