"""Reference kernel providers registered into the IR: C++ CPU (`cpp`), Triton (`triton`), CUDA (`cuda`)."""
