"""Platform of the 'untraceable' fault (kernels in conformance_broken.untraceable_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("untraceable")

EXPECTED = Fault(family="compile", outcome="FAIL", fragments=("not traceable by make_fx",),
                 checked_by=("test_untraceable_provider_gets_one_compile_fail_and_identical_messages_run_to_run",))
