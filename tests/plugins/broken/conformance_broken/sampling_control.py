"""Platform of the 'sampling_control' control: a sampler written another way than the reference (top-p by a
descending sort, draws by torch.multinomial per request), which keeps vLLM's semantics and must pass."""

from conformance_broken.records import Control
from conformance_broken.sampling_base import sampling_platform

Platform = sampling_platform("sampling_control")

EXPECTED = Control(family="sampling", checked_by=("test_the_correct_sampler_twin_passes_every_sampling_check",))
