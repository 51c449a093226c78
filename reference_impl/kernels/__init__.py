"""Reference kernel providers registered into the IR: C++ CPU (`cpu`), Triton (`triton`), CUDA (`cuda`)."""
