"""Platform of the 'loosens_tolerance' fault (kernels in conformance_broken.loosens_tolerance_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Control

Platform = make_platform("loosens_tolerance")

# Not caught, by design: the run is judged against the loosened tolerance, and says so.
EXPECTED = Control(family="numerics",
                   checked_by=("test_a_plugin_that_loosens_its_own_tolerance_passes_and_says_so",))
