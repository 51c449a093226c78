"""Platform of the 'odd_numerics' fault (kernels in conformance_broken.odd_numerics_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("odd_numerics")

EXPECTED = Fault(family="numerics", outcome="FAIL", fragments=("hidden=769",), also_passes=True,
                 end_to_end=("-k", "numerics and rms_norm and float32"), clean_too=True)
