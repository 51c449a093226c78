"""Reference implementation of a vLLM-style op layer: platforms, CustomOp, the functional IR,
layers, kernels and compile passes that vendor plugins are checked against."""

__version__ = "0.1.0"
