"""Triton device helpers shared by the kernels (imported only when triton is importable).

Kernels compute in float32 and round to the tensor dtype at the points where the native PyTorch
code rounds (every eager op on a half-precision tensor rounds its result), so results match
native bit for bit wherever float32 arithmetic agrees. Compiled for a GPU, `round_to` is the
hardware conversion (cvt.rn: nearest, ties to even, NaN stays NaN). Under the interpreter, which
truncates float32 -> bfloat16, bfloat16 rounding is integer arithmetic on the float32 bits; it
costs about eight instructions where the conversion costs one or two, which made the bfloat16
GELU kernels compute-bound on an H100 (about 95 PTX instructions per element for gelu_new).
`round_to_e4m3` is integer arithmetic (the interpreter mis-rounds float8); the quant kernels use it
where the GPU has no fp8 conversion (see _quant_jit). Integer tricks must leave NaN a NaN whatever
its payload: NVIDIA GPUs produce 0x7FFFFFFF, where adding a
rounding bias carries into the exponent and sign (NaN would become -0 or Inf).
"""

import triton
import triton.language as tl

from reference_impl.kernels.triton._env import INTERPRET


@triton.jit
def _is_nan_bits(bits):
    """Whether float32 bit patterns `bits` (uint32) are NaN: exponent all ones, mantissa non-zero.

    Decided on the integers so no float compare (or fast-math assumption) is involved."""
    return (bits & 0x7FFFFFFF) > 0x7F800000


@triton.jit
def _round_to_by_bits(x, DTYPE: tl.constexpr):
    """Round float32 `x` to the precision of DTYPE (nearest, ties to even), staying float32, with
    integer arithmetic for bfloat16 (the interpreter's float32 -> bfloat16 cast truncates)."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        # A NaN keeps its sign and stays NaN after truncation (quiet bit set); Inf rounds to itself.
        quiet_nan = (bits | 0x00400000) & 0xFFFF0000
        bits = tl.where(_is_nan_bits(bits), quiet_nan, rounded)
        return bits.to(tl.float32, bitcast=True)
    elif DTYPE == tl.float16:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x


@triton.jit
def _round_to_by_conversion(x, DTYPE: tl.constexpr):
    """Round float32 `x` to the precision of DTYPE (nearest, ties to even), staying float32, by
    the hardware conversion."""
    if DTYPE == tl.bfloat16:
        return x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
    elif DTYPE == tl.float16:
        return x.to(tl.float16, fp_downcast_rounding="rtne").to(tl.float32)
    else:
        return x


# Decided when the kernels are decorated, as Triton decides between compiling and interpreting.
round_to = _round_to_by_bits if INTERPRET else _round_to_by_conversion


@triton.jit
def round_to_e4m3(v):
    """Round float32 `v` (already clamped to [-448, 448]) to the nearest float8_e4m3fn value.

    NaN (any payload) is returned as is; the clamp before it must propagate NaN."""
    v_bits = v.to(tl.uint32, bitcast=True)
    bits = v_bits & 0x7FFFFFFF
    a = bits.to(tl.float32, bitcast=True)
    # Normal range (>= 2^-6): keep 3 mantissa bits, ties to even.
    normal = (bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000
    # Subnormal range: multiples of 2^-9; adding 2^14 puts the float32 ulp exactly at 2^-9.
    subnormal = ((a + 16384.0) - 16384.0).to(tl.uint32, bitcast=True)
    r = tl.where(bits >= 0x3C800000, normal, subnormal)  # 0x3C800000 is 2^-6
    r = tl.where(_is_nan_bits(bits), v_bits, r | (v_bits & 0x80000000))
    return r.to(tl.float32, bitcast=True)


@triton.jit
def tanh(x):
    """tanh from exp, symmetric so it never overflows; absolute error ~1e-7 in float32."""
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def silu(x):
    return x / (1.0 + tl.exp(-x))


@triton.jit
def sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))
