"""The Triton kernel provider (`"triton"`): rms_norm, fused_add_rms_norm (in place), the gated
activations and GELU family, rotary embedding (in place) and fp8 quantization.

Importing this package registers the implementations. It never fails for lack of triton: the
implementations are then registered with `supported=False` (see `_env` for the rule, and
`UNSUPPORTED_REASON` for why, when they cannot run).
"""

from reference_impl.kernels.triton._env import HAS_TRITON, INTERPRET, SUPPORTED, UNSUPPORTED_REASON
from reference_impl.kernels.triton import activation, norm, quant, rotary  # noqa: F401  (registrations)

PROVIDER = "triton"

# IR op name -> whether the implementation writes into its activation inputs.
IMPLEMENTED_OPS = {
    "rms_norm": False, "fused_add_rms_norm": True,
    "silu_and_mul": False, "mul_and_silu": False, "gelu_and_mul": False, "fatrelu_and_mul": False,
    "swigluoai_and_mul": False, "gelu_new": False, "gelu_fast": False, "quick_gelu": False, "relu2": False,
    "rotary_embedding": True, "rotary_embedding_query": True,
    "static_quant_fp8": False, "dynamic_quant_fp8": False, "dynamic_group_quant_fp8": False,
}

__all__ = ["PROVIDER", "IMPLEMENTED_OPS", "HAS_TRITON", "INTERPRET", "SUPPORTED", "UNSUPPORTED_REASON"]
