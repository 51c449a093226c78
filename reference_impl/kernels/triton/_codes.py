"""Activation codes shared by the host wrappers and the kernels (plain ints: no triton needed)."""

# Gated activations (constexpr ACT of gated_kernel).
SILU_AND_MUL = 0
MUL_AND_SILU = 1
GELU_AND_MUL = 2
GELU_TANH_AND_MUL = 3
FATRELU_AND_MUL = 4
SWIGLUOAI_AND_MUL = 5

# Element-wise activations (constexpr ACT of unary_kernel).
GELU_NEW = 0
GELU_FAST = 1
QUICK_GELU = 2
RELU2 = 3
