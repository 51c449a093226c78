"""Platform of the 'ignores_neox' fault (kernels in conformance_broken.ignores_neox_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("ignores_neox", {"rotary_embedding": ["broken", "native"]})

EXPECTED = Fault(family="numerics", outcome="FAIL", fragments=("The output is native's for is_neox_style=False",),
                 also_passes=True, hint=("only cases with is_neox_style=True fail", "no tolerance override fits"))
