"""Triton implementations of IR `rotary_embedding` and `rotary_embedding_query`, both in place.

The functional overload hands these implementations clones, so only the in-place kernel exists:
the pass-through features (beyond rotary_dim) are simply never written.
"""

from __future__ import annotations

from torch import Tensor

from reference_impl import ir
from reference_impl.kernels.triton import _env, _launch
from reference_impl.kernels.triton._host import LAUNCH_OPTIONS, float_tensor_ok, triton_op

if _env.HAS_TRITON:
    from reference_impl.kernels.triton import _rotary_jit as _jit

PROVIDER = "triton"


def _heads_ok(x: Tensor, head_size: int) -> bool:
    # Static properties only (no guard on the token count): the last dim holds whole heads.
    return float_tensor_ok(x) and x.dim() >= 1 and head_size > 0 and x.shape[-1] % head_size == 0


def _common_ok(positions: Tensor, x_query: Tensor, head_size: int, cos_sin_cache: Tensor) -> bool:
    return (not positions.is_floating_point() and not positions.is_complex() and _env.device_ok(positions)
            and cos_sin_cache.dim() == 2 and cos_sin_cache.shape[-1] % 2 == 0
            and 0 < cos_sin_cache.shape[-1] <= head_size and float_tensor_ok(cos_sin_cache)
            and _heads_ok(x_query, head_size))


def _heads_view(x: Tensor, tokens: int, head_size: int) -> Tensor | None:
    try:
        return x.view(tokens, -1, head_size)
    except RuntimeError:
        return None


def _rotate_in_place(positions: Tensor, query: Tensor, key: Tensor | None, head_size: int,
                     cos_sin_cache: Tensor, is_neox_style: bool) -> None:
    tokens = positions.numel()
    q3 = _heads_view(query, tokens, head_size)
    k3 = _heads_view(key, tokens, head_size) if key is not None else None
    if q3 is None or (key is not None and k3 is None):
        # No [tokens, heads, head_size] view of the caller's memory: rotate copies, write back.
        q_copy = query.reshape(tokens, -1, head_size).clone()
        k_copy = key.reshape(tokens, -1, head_size).clone() if key is not None else None
        _rotate_in_place(positions, q_copy, k_copy, head_size, cos_sin_cache, is_neox_style)
        query.copy_(q_copy.view(query.shape))
        if key is not None:
            key.copy_(k_copy.view(key.shape))
        return
    if tokens == 0:
        return
    half = cos_sin_cache.shape[-1] // 2
    pos = positions.reshape(-1)
    k_arg = k3 if k3 is not None else q3
    _jit.rotary_kernel[(tokens,)](
        pos, q3, q3.stride(0), q3.stride(1), q3.stride(2), q3.shape[1],
        k_arg, k_arg.stride(0), k_arg.stride(1), k_arg.stride(2), k_arg.shape[1],
        cos_sin_cache, cos_sin_cache.stride(0), cos_sin_cache.stride(1), half,
        IS_NEOX=bool(is_neox_style), HAS_KEY=k3 is not None,
        Q_HEADS_BLOCK=_env.next_power_of_2(q3.shape[1]), K_HEADS_BLOCK=_env.next_power_of_2(k_arg.shape[1]),
        HALF_BLOCK=_env.next_power_of_2(half),
        num_warps=_launch.num_warps(2 * _env.next_power_of_2(q3.shape[1]) * _env.next_power_of_2(half),
                                    q3.element_size()),
        **LAUNCH_OPTIONS)


@triton_op("rotary_embedding", mutates_args=("x_query", "x_key"))
def _rope_op(positions: Tensor, x_query: Tensor, x_key: Tensor, head_size: int, cos_sin_cache: Tensor,
             is_neox_style: bool) -> None:
    _env.require()
    _rotate_in_place(positions, x_query, x_key, head_size, cos_sin_cache, is_neox_style)


@triton_op("rotary_embedding_query", mutates_args=("x_query",))
def _rope_query_op(positions: Tensor, x_query: Tensor, head_size: int, cos_sin_cache: Tensor,
                   is_neox_style: bool) -> None:
    _env.require()
    _rotate_in_place(positions, x_query, None, head_size, cos_sin_cache, is_neox_style)


def _rope_supports(positions, x_query, x_key, head_size, cos_sin_cache, is_neox_style) -> bool:
    return (_common_ok(positions, x_query, head_size, cos_sin_cache)
            and _heads_ok(x_key, head_size))


@ir.ops.rotary_embedding.register_impl(PROVIDER, supported=_env.SUPPORTED, supports_args=_rope_supports,
                                       inplace=True)
def rotary_embedding(positions: Tensor, x_query: Tensor, x_key: Tensor, head_size: int,
                     cos_sin_cache: Tensor, is_neox_style: bool) -> tuple[Tensor, Tensor]:
    _rope_op(positions, x_query, x_key, head_size, cos_sin_cache, is_neox_style)
    return x_query, x_key


def _rope_query_supports(positions, x_query, head_size, cos_sin_cache, is_neox_style) -> bool:
    return _common_ok(positions, x_query, head_size, cos_sin_cache)


@ir.ops.rotary_embedding_query.register_impl(PROVIDER, supported=_env.SUPPORTED,
                                             supports_args=_rope_query_supports, inplace=True)
def rotary_embedding_query(positions: Tensor, x_query: Tensor, head_size: int, cos_sin_cache: Tensor,
                           is_neox_style: bool) -> Tensor:
    _rope_query_op(positions, x_query, head_size, cos_sin_cache, is_neox_style)
    return x_query
