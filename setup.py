"""Packaging that pyproject.toml cannot say: the wheel ships `csrc/` (the C++ and CUDA kernel
sources the `cpp` and `cuda` providers JIT-build at first use) as `reference_impl/_csrc/`.

Everything else (metadata, dependencies, entry points) is in pyproject.toml.
"""

from setuptools import find_namespace_packages, find_packages, setup

CSRC = "reference_impl._csrc"
csrc_packages = [CSRC, *(f"{CSRC}.{sub}" for sub in find_namespace_packages(where="csrc"))]

setup(
    packages=[*find_packages(include=["reference_impl*", "conformance*", "suites*"]), *csrc_packages],
    package_dir={CSRC: "csrc"},
    package_data={package: ["*"] for package in csrc_packages},
)
