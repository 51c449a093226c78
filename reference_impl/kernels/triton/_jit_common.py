"""Triton device helpers shared by the kernels (imported only when triton is importable).

Kernels compute in float32 and round to the tensor dtype at the points where the native PyTorch
code rounds (every eager op on a half-precision tensor rounds its result), so results match
native bit for bit wherever float32 arithmetic agrees. Roundings are done with integer
arithmetic on the float32 bits because the Triton interpreter truncates float32 -> bfloat16 and
mis-rounds float8; a value that is already representable converts exactly on every backend.
"""

import triton
import triton.language as tl


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """Round float32 `x` to the precision of DTYPE (nearest, ties to even), staying float32."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    elif DTYPE == tl.float16:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x


@triton.jit
def round_to_e4m3(v):
    """Round float32 `v` (already clamped to [-448, 448]) to the nearest float8_e4m3fn value."""
    a = tl.abs(v)
    bits = a.to(tl.uint32, bitcast=True)
    # Normal range (>= 2^-6): keep 3 mantissa bits, ties to even.
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    # Subnormal range: multiples of 2^-9; adding 2^14 puts the float32 ulp exactly at 2^-9.
    subnormal = (a + 16384.0) - 16384.0
    r = tl.where(a >= 0.015625, normal, subnormal)
    sign = v.to(tl.uint32, bitcast=True) & 0x80000000
    return (r.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


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
