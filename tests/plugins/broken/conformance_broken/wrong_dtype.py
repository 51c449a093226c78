"""Platform of the 'wrong_dtype' fault (kernels in conformance_broken.wrong_dtype_kernels)."""

from conformance_broken.base import make_platform
from conformance_broken.records import Fault

Platform = make_platform("wrong_dtype")

EXPECTED = Fault(family="numerics", outcome="FAIL", fragments=("dtype is float32, native gives bfloat16",),
                 dtype="bfloat16")
