"""Platform of the 'segfault_shape' fault (kernels in conformance_broken.segfault_shape_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("segfault_shape", {"rotary_embedding": ["broken", "native"]})

EXPECTED = Fault(family="numerics", outcome="CRASH", fragments=("SIGSEGV",), dtype="bfloat16", level="standard",
                 in_process=False,
                 checked_by=("test_a_crash_on_one_drawn_shape_is_named_everywhere_and_its_repro_prints_the_signal",))
