"""Platform of the 'contiguous_only' fixture (kernels in conformance_broken.contiguous_only_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Control

Platform = make_platform("contiguous_only")

EXPECTED = Control(family="dispatch", checked_by=("test_contiguity_predicate_passes_the_batch_rule",))
