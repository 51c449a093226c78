"""Platform of the 'tanh_gelu' fault (kernels in conformance_broken.tanh_gelu_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("tanh_gelu", {"gelu_and_mul": ["broken", "native"]})

EXPECTED = Fault(family="numerics", outcome="FAIL",
                 fragments=("The output is native's for approximate='tanh', not for the approximate='none' asked",),
                 also_passes=True, hint=("only cases with approximate='none' fail", "no tolerance override fits"))
