"""Registration of a compiled kernel library (C++ CPU or CUDA) as one IR provider.

Both libraries expose the same op schemas (csrc/common/schemas.inc) under their own namespace;
`register_kernel_provider` registers an implementation of every op that calls the library (for
gelu_and_mul_sparse: the gate's sparsification in torch, then the gelu_and_mul kernel), with
`supports_args` deciding from static properties only (dtypes, devices, last-dim contiguity,
argument values, sizes of non-batch dims), with comparisons that also work on the symbolic sizes
of compile lowering (a SymBool answer is guarded on there; see docs/ir-dispatch.md). What the kernels do not handle is declined so those
calls go to the next provider: a non-contiguous last dim, mixed dtypes, broadcasting weights or
scales, self-overlapping in-place targets. Leading (row) dims may have any strides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from reference_impl import ir

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Integer arguments may arrive as SymInt in compile lowering (predicates compare them, never int() them).
INT_TYPES = (int, torch.SymInt)
MAX_DIMS = 9  # at most 8 leading (row) dims after merging; see csrc/*/kernels.h

OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "mul_and_silu", "gelu_and_mul", "gelu_and_mul_sparse",
       "fatrelu_and_mul", "swigluoai_and_mul", "gelu_new", "gelu_fast", "quick_gelu", "relu2",
       "rotary_embedding", "rotary_embedding_query", "static_quant_fp8", "dynamic_quant_fp8",
       "dynamic_group_quant_fp8")
INPLACE_OPS = ("fused_add_rms_norm", "rotary_embedding", "rotary_embedding_query")
# The CUDA rotary kernel keeps one token's cos/sin in 48 KB of shared memory and counts a token's work
# items in int (csrc/cuda/rotary.cu): larger shapes are declined, so they run native instead of failing.
CUDA_MAX_ROTARY_HALF = 6144
CUDA_MAX_ROTARY_HEAD_ELEMENTS = 1 << 30


class ArgChecks:
    """The `supports_args` predicates for kernels on one device type."""

    def __init__(self, device_type: str):
        self.device_type = device_type
        # `t.is_cpu` / `t.is_cuda` cost a sixth of `t.device.type`: these checks run on every call.
        self._flag = {"cpu": "is_cpu", "cuda": "is_cuda"}.get(device_type)

    def on_device(self, t) -> bool:
        if not isinstance(t, Tensor):
            return False
        if self._flag is not None:
            return getattr(t, self._flag)
        return t.device.type == self.device_type

    def rows_ok(self, x) -> bool:
        """A float tensor of 1..9 dims on the device whose last dim is contiguous (rows may be strided)."""
        return (self.on_device(x) and x.dtype in DTYPES and 1 <= x.dim() <= MAX_DIMS
                and x.stride()[-1] == 1)

    @staticmethod
    def writable(x) -> bool:
        """In-place targets must not overlap themselves (no stride-0 dims)."""
        return all(s != 0 for s in x.stride())

    def weight_ok(self, weight, x) -> bool:
        return weight is None or (self.on_device(weight) and weight.dtype == x.dtype and weight.dim() == 1
                                  and weight.shape[0] == x.shape[-1] and weight.stride(0) == 1)

    def even_last(self, x) -> bool:
        return self.rows_ok(x) and x.shape[-1] % 2 == 0

    # --- one predicate per op, taking exactly the op's arguments ---
    def rms_norm(self, x, weight, epsilon, variance_size=None) -> bool:
        return self.rows_ok(x) and self.weight_ok(weight, x)

    def fused_add_rms_norm(self, x, x_residual, weight, epsilon, variance_size=None) -> bool:
        return (self.rows_ok(x) and self.rows_ok(x_residual) and x_residual.dtype == x.dtype
                and x_residual.dim() == x.dim() and x_residual.shape[-1] == x.shape[-1]
                and self.writable(x) and self.writable(x_residual) and self.weight_ok(weight, x))

    def gated(self, x, *params) -> bool:
        return self.even_last(x)

    def gelu_and_mul(self, x, approximate="none") -> bool:
        return self.even_last(x) and approximate in ("none", "tanh")

    def gelu_and_mul_sparse(self, x, std_multiplier, approximate="none") -> bool:
        return self.gelu_and_mul(x, approximate)

    def unary(self, x) -> bool:
        return self.rows_ok(x)

    def _heads_ok(self, x, head_size) -> bool:
        return self.rows_ok(x) and self.writable(x) and x.shape[-1] % head_size == 0

    def _rope_common(self, positions, x_query, head_size, cos_sin_cache) -> bool:
        if not (isinstance(head_size, INT_TYPES) and head_size > 0 and self.on_device(positions)
                and positions.dtype in (torch.int64, torch.int32) and self.on_device(cos_sin_cache)
                and cos_sin_cache.dim() == 2 and cos_sin_cache.stride(-1) == 1):
            return False
        rot = cos_sin_cache.shape[-1]
        if self.device_type == "cuda" and rot // 2 > CUDA_MAX_ROTARY_HALF:
            return False
        return (self._heads_ok(x_query, head_size)
                and cos_sin_cache.dtype in (x_query.dtype, torch.float32) and rot % 2 == 0 and rot <= head_size)

    def _rope_heads_fit(self, head_size, cos_sin_cache, *xs) -> bool:
        heads = sum(x.shape[-1] // head_size for x in xs)
        return self.device_type != "cuda" or heads * cos_sin_cache.shape[-1] <= CUDA_MAX_ROTARY_HEAD_ELEMENTS

    def rotary_embedding(self, positions, x_query, x_key, head_size, cos_sin_cache, is_neox_style) -> bool:
        return (self._rope_common(positions, x_query, head_size, cos_sin_cache)
                and self._heads_ok(x_key, head_size) and x_key.dtype == x_query.dtype
                and self._rope_heads_fit(head_size, cos_sin_cache, x_query, x_key))

    def rotary_embedding_query(self, positions, x_query, head_size, cos_sin_cache, is_neox_style) -> bool:
        return (self._rope_common(positions, x_query, head_size, cos_sin_cache)
                and self._rope_heads_fit(head_size, cos_sin_cache, x_query))

    def static_quant_fp8(self, x, scale) -> bool:
        if not (self.rows_ok(x) and self.on_device(scale) and scale.is_floating_point()
                and scale.dim() <= x.dim()):
            return False
        groups = scale.shape[-1] if scale.dim() >= 1 else 1
        return groups >= 1 and x.shape[-1] % groups == 0

    def dynamic_quant_fp8(self, x, per_token, scale_ub=None) -> bool:
        return (self.rows_ok(x) and isinstance(per_token, bool)
                and (scale_ub is None or (self.on_device(scale_ub) and scale_ub.is_floating_point()
                                          and scale_ub.dim() <= 1 and scale_ub.numel() == 1)))

    def dynamic_group_quant_fp8(self, x, group_size) -> bool:
        return (self.rows_ok(x) and isinstance(group_size, INT_TYPES) and group_size > 0
                and x.shape[-1] % group_size == 0)


def register_kernel_provider(provider: str, *, supported: bool, library: Callable[[], Any],
                             device_type: str) -> ArgChecks:
    """Register `provider` for every op in OPS; `library()` returns the loaded `torch.ops.<ns>`."""
    checks = ArgChecks(device_type)

    def reg(op_name: str, supports_args: Callable[..., bool]):
        op = getattr(ir.ops, op_name)
        return op.register_impl(provider, supported=supported, supports_args=supports_args,
                                inplace=op_name in INPLACE_OPS)

    @reg("rms_norm", checks.rms_norm)
    def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
        return library().rms_norm(x, weight, epsilon, variance_size)

    @reg("fused_add_rms_norm", checks.fused_add_rms_norm)
    def fused_add_rms_norm(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float,
                           variance_size: int | None = None) -> tuple[Tensor, Tensor]:
        library().fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size)
        return x, x_residual

    @reg("silu_and_mul", checks.gated)
    def silu_and_mul(x: Tensor) -> Tensor:
        return library().silu_and_mul(x)

    @reg("mul_and_silu", checks.gated)
    def mul_and_silu(x: Tensor) -> Tensor:
        return library().mul_and_silu(x)

    @reg("gelu_and_mul", checks.gelu_and_mul)
    def gelu_and_mul(x: Tensor, approximate: str = "none") -> Tensor:
        return library().gelu_and_mul(x, approximate)

    @reg("fatrelu_and_mul", checks.gated)
    def fatrelu_and_mul(x: Tensor, threshold: float = 0.0) -> Tensor:
        return library().fatrelu_and_mul(x, threshold)

    @reg("gelu_and_mul_sparse", checks.gelu_and_mul_sparse)
    def gelu_and_mul_sparse(x: Tensor, std_multiplier: float, approximate: str = "none") -> Tensor:
        # The gate's sparsification (two row reductions) in torch, then the gelu_and_mul kernel.
        d = x.shape[-1] // 2
        gate = x[..., :d]
        mean = torch.mean(gate, dim=-1, keepdim=True)
        std = torch.std(gate, dim=-1, keepdim=True, unbiased=False)
        sparse = torch.relu(gate - (mean + std * std_multiplier))
        return library().gelu_and_mul(torch.cat((sparse, x[..., d:]), dim=-1), approximate)

    @reg("swigluoai_and_mul", checks.gated)
    def swigluoai_and_mul(x: Tensor, alpha: float = 1.702, limit: float = 7.0) -> Tensor:
        return library().swigluoai_and_mul(x, alpha, limit)

    @reg("gelu_new", checks.unary)
    def gelu_new(x: Tensor) -> Tensor:
        return library().gelu_new(x)

    @reg("gelu_fast", checks.unary)
    def gelu_fast(x: Tensor) -> Tensor:
        return library().gelu_fast(x)

    @reg("quick_gelu", checks.unary)
    def quick_gelu(x: Tensor) -> Tensor:
        return library().quick_gelu(x)

    @reg("relu2", checks.unary)
    def relu2(x: Tensor) -> Tensor:
        return library().relu2(x)

    @reg("rotary_embedding", checks.rotary_embedding)
    def rotary_embedding(positions: Tensor, x_query: Tensor, x_key: Tensor, head_size: int,
                         cos_sin_cache: Tensor, is_neox_style: bool) -> tuple[Tensor, Tensor]:
        library().rotary_embedding(positions, x_query, x_key, head_size, cos_sin_cache, is_neox_style)
        return x_query, x_key

    @reg("rotary_embedding_query", checks.rotary_embedding_query)
    def rotary_embedding_query(positions: Tensor, x_query: Tensor, head_size: int, cos_sin_cache: Tensor,
                               is_neox_style: bool) -> Tensor:
        library().rotary_embedding(positions, x_query, None, head_size, cos_sin_cache, is_neox_style)
        return x_query

    @reg("static_quant_fp8", checks.static_quant_fp8)
    def static_quant_fp8(x: Tensor, scale: Tensor) -> Tensor:
        return library().static_quant_fp8(x, scale)

    @reg("dynamic_quant_fp8", checks.dynamic_quant_fp8)
    def dynamic_quant_fp8(x: Tensor, per_token: bool, scale_ub: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return library().dynamic_quant_fp8(x, per_token, scale_ub)

    @reg("dynamic_group_quant_fp8", checks.dynamic_group_quant_fp8)
    def dynamic_group_quant_fp8(x: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
        return library().dynamic_group_quant_fp8(x, group_size)

    return checks


def register_fakes(namespace: str) -> None:
    """Fake (meta) implementations of the library's ops that allocate outputs (in-place ops need none)."""
    fp8 = torch.float8_e4m3fn

    def same(x, *args):
        return x.new_empty(x.shape)

    def half_last(x, *args):
        return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))

    def static_quant(x, scale):
        s = scale.unsqueeze(0) if scale.ndim == 1 and scale.numel() > 1 else scale
        s_shape = list(s.shape) or [1]
        s_shape[-1] = x.shape[-1] if s_shape[-1] > 1 else 1
        return x.new_empty(torch.broadcast_shapes(x.shape, s_shape), dtype=fp8)

    def dynamic_quant(x, per_token, scale_ub):
        scale_shape = (*x.shape[:-1], 1) if per_token else (1,)
        return x.new_empty(x.shape, dtype=fp8), x.new_empty(scale_shape, dtype=torch.float32)

    def group_quant(x, group_size):
        return (x.new_empty(x.shape, dtype=fp8),
                x.new_empty((*x.shape[:-1], x.shape[-1] // group_size), dtype=torch.float32))

    fakes = {
        "rms_norm": same, "gelu_new": same, "gelu_fast": same, "quick_gelu": same, "relu2": same,
        "silu_and_mul": half_last, "mul_and_silu": half_last, "gelu_and_mul": half_last,
        "fatrelu_and_mul": half_last, "swigluoai_and_mul": half_last,
        "static_quant_fp8": static_quant, "dynamic_quant_fp8": dynamic_quant,
        "dynamic_group_quant_fp8": group_quant,
    }
    for op_name, fn in fakes.items():
        torch.library.register_fake(f"{namespace}::{op_name}", fn)
