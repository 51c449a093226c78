"""Platform of the 'wrong_dtype' fault (kernels in conformance_broken.wrong_dtype_kernels)."""

from conformance_broken.base import make_platform

Platform = make_platform("wrong_dtype")
