"""Reference kernel providers registered into the IR: C++ CPU (`cpp`), Triton (`triton`), CUDA (`cuda`)."""


def load_built_libraries() -> None:
    """Load the kernel libraries that build on first use and are built already, without building.
    Compiled code that inductor serves from its cache calls them directly, before any kernel call
    would have loaded them (reference_impl/compilation/backend.py)."""
    from reference_impl.kernels import _cpp_build

    _cpp_build.load_if_built()
