"""Rotary position embedding layers (docs/catalog.md): RotaryEmbedding, DualChunkRotaryEmbedding,
ApplyRotaryEmb. All of them rotate through IR `rotary_embedding` / `rotary_embedding_query`.

RotaryEmbedding's context-extension variants only change its cos/sin cache (`_compute_cos_sin_cache`):
LinearScalingRotaryEmbedding, DynamicNTKScalingRotaryEmbedding, Llama3RotaryEmbedding and
YaRNScalingRotaryEmbedding, with the formulas of transformers' rope init functions / vLLM. They are
subclasses, not registered names of their own (as in vLLM), so they run wherever RotaryEmbedding runs.

The layers use the functional IR form: query and key are never modified and fresh tensors are
returned. vLLM's CUDA path rotates in place, but its native form is functional too, and callers
that still hold q/k (views of a fused qkv projection, for example) stay safe; the cost is one copy
of q/k when an in-place kernel is selected, which compile passes may remove.
"""

from __future__ import annotations

import math

import torch

from reference_impl import ir
from reference_impl.custom_op import CustomOp
from reference_impl.ir import real_models
from reference_impl.ir.cases import randn, row_strided
from reference_impl.ir.ops.rotary import compute_cos_sin_cache, cos_sin_rows
from reference_impl.ir.tolerances import ELEMENTWISE_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases


def _check_rotary_dims(cls_name: str, head_size: int, rotary_dim: int, max_position: int, base: float) -> None:
    if head_size <= 0:
        raise ValueError(f"{cls_name}: head_size={head_size} must be positive")
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_size:
        raise ValueError(f"{cls_name}: rotary_dim={rotary_dim} must be even and in [2, head_size={head_size}]")
    if max_position <= 0:
        raise ValueError(f"{cls_name}: max_position_embeddings={max_position} must be positive")
    if not base > 0:
        raise ValueError(f"{cls_name}: base={base!r} must be positive")


def _on_device(cache: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return cache if cache.device == like.device else cache.to(like.device)


@CustomOp.register("rotary_embedding")
class RotaryEmbedding(CustomOp):
    """Rotary embedding with a `[max_position, rotary_dim]` cos/sin cache (cos | sin halves), built in
    float32 and cast to `dtype` (vLLM 0.32; see compute_cos_sin_cache).

    `forward(positions, query, key=None) -> (query, key)` rotates the first rotary_dim features
    of every head, neox style (halves) or gptj style (interleaved pairs); `key=None` returns
    `(query, None)`. Query/key are `[tokens, heads * head_size]` or `[tokens, heads, head_size]`.
    The cache is cast to the query's dtype for the rotation, as vLLM's native form does.
    `init_cache=False` (vLLM's, for subclasses that build their own cache) registers no cache.
    """

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float,
                 is_neox_style: bool, dtype: torch.dtype, init_cache: bool = True, *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        _check_rotary_dims(type(self).__name__, head_size, rotary_dim, max_position_embeddings, base)
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        self.is_neox_style = is_neox_style
        self.dtype = dtype
        if init_cache:
            self.register_buffer("cos_sin_cache", self._compute_cos_sin_cache().to(dtype), persistent=False)

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        """`[max_position_embeddings, rotary_dim]` cos | sin as vLLM 0.32 builds it (subclasses change the
        frequencies or the scale)."""
        return compute_cos_sin_cache(self.head_size, self.rotary_dim, self.max_position_embeddings, self.base,
                                     self.dtype)

    def forward_native(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None):
        cache = _on_device(self.cos_sin_cache, query)
        if key is None:
            return (ir.ops.rotary_embedding_query(positions, query, self.head_size, cache, self.is_neox_style),
                    None)
        return ir.ops.rotary_embedding(positions, query, key, self.head_size, cache, self.is_neox_style)

    def extra_repr(self) -> str:
        return (f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, "
                f"max_position_embeddings={self.max_position_embeddings}, base={self.base}, "
                f"is_neox_style={self.is_neox_style}")


def _inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    """`1 / base^(2i / rotary_dim)` for i < rotary_dim / 2, in float64."""
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))


def _cache_from_inv_freq(inv_freq: torch.Tensor, max_position: int, scale: float = 1.0) -> torch.Tensor:
    """cos | sin of `position * inv_freq` for positions `0..max_position-1`, times `scale` (float64)."""
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float64), inv_freq)
    return torch.cat((freqs.cos() * scale, freqs.sin() * scale), dim=-1)


def _check_factor(cls_name: str, factor: float) -> float:
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1.0:
        raise ValueError(f"{cls_name}: scaling_factor={factor!r} must be a number >= 1")
    return float(factor)


class LinearScalingRotaryEmbedding(RotaryEmbedding):
    """Position interpolation: every frequency divided by `scaling_factor` (position p rotates as p / factor)."""

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float,
                 is_neox_style: bool, scaling_factor: float, dtype: torch.dtype, *, enforce_enable: bool = False):
        self.scaling_factor = _check_factor(type(self).__name__, scaling_factor)
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype,
                         enforce_enable=enforce_enable)

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        return _cache_from_inv_freq(_inv_freq(self.rotary_dim, self.base) / self.scaling_factor,
                                    self.max_position_embeddings)


class DynamicNTKScalingRotaryEmbedding(RotaryEmbedding):
    """Dynamic NTK: `base * ((factor * max_position / max_trained_positions) - (factor - 1))^(rot / (rot - 2))`.

    With `max_trained_positions` equal to `max_position_embeddings` (the default, as a transformers
    config says) the base is unchanged: transformers rescales only once a sequence outgrows
    max_position_embeddings, which this cache does not cover.
    """

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float,
                 is_neox_style: bool, scaling_factor: float, dtype: torch.dtype,
                 max_trained_positions: int | None = None, *, enforce_enable: bool = False):
        self.scaling_factor = _check_factor(type(self).__name__, scaling_factor)
        self.max_trained_positions = max_trained_positions or max_position_embeddings
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype,
                         enforce_enable=enforce_enable)

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        f = self.scaling_factor
        stretch = f * self.max_position_embeddings / self.max_trained_positions - (f - 1)
        base = self.base * stretch ** (self.rotary_dim / (self.rotary_dim - 2))
        return _cache_from_inv_freq(_inv_freq(self.rotary_dim, base), self.max_position_embeddings)


class Llama3RotaryEmbedding(RotaryEmbedding):
    """Llama 3.1 frequency scaling: wavelengths below `original / high_freq_factor` kept, above
    `original / low_freq_factor` divided by `scaling_factor`, in between a linear blend in
    `original / wavelength`."""

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float,
                 is_neox_style: bool, dtype: torch.dtype, scaling_factor: float, low_freq_factor: float,
                 high_freq_factor: float, original_max_position: int, *, enforce_enable: bool = False):
        name = type(self).__name__
        self.scaling_factor = _check_factor(name, scaling_factor)
        if not 0 < low_freq_factor <= high_freq_factor:
            raise ValueError(f"{name}: need 0 < low_freq_factor <= high_freq_factor, got {low_freq_factor}, "
                             f"{high_freq_factor}")
        if not original_max_position > 0:
            raise ValueError(f"{name}: original_max_position={original_max_position!r} must be positive")
        self.low_freq_factor = float(low_freq_factor)
        self.high_freq_factor = float(high_freq_factor)
        self.original_max_position = original_max_position
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype,
                         enforce_enable=enforce_enable)

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        inv_freq = _inv_freq(self.rotary_dim, self.base)
        wavelength = 2 * math.pi / inv_freq
        low, high = self.low_freq_factor, self.high_freq_factor
        smooth = (self.original_max_position / wavelength - low) / (high - low) if high > low else 0.0
        blended = (1 - smooth) * inv_freq / self.scaling_factor + smooth * inv_freq
        scaled = torch.where(wavelength > self.original_max_position / low, inv_freq / self.scaling_factor,
                             blended)
        scaled = torch.where(wavelength < self.original_max_position / high, inv_freq, scaled)
        return _cache_from_inv_freq(scaled, self.max_position_embeddings)


def yarn_attention_factor(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """YaRN's cos/sin magnitude: `0.1 ln(factor) + 1` (or the mscale / mscale_all_dim ratio of it)."""
    def get(scale_mult: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * scale_mult * math.log(factor) + 1.0

    if mscale and mscale_all_dim:
        return get(mscale) / get(mscale_all_dim)
    return get(1.0)


class YaRNScalingRotaryEmbedding(RotaryEmbedding):
    """YaRN (arXiv 2309.00071): per-frequency blend of interpolated (`/ scaling_factor`) and original
    frequencies by a linear ramp over the dims between the `beta_fast` / `beta_slow` rotation counts
    within `original_max_position` (bounds floored / ceiled when `truncate`), cos and sin times
    `attention_factor` (default `yarn_attention_factor`). `max_position_embeddings` is the cache
    length (vLLM passes the original length and extends it by the factor)."""

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float,
                 is_neox_style: bool, scaling_factor: float, dtype: torch.dtype, original_max_position: int, *,
                 beta_fast: float = 32, beta_slow: float = 1, mscale: float | None = None,
                 mscale_all_dim: float | None = None, attention_factor: float | None = None,
                 truncate: bool = True, enforce_enable: bool = False):
        name = type(self).__name__
        self.scaling_factor = _check_factor(name, scaling_factor)
        if not original_max_position > 0:
            raise ValueError(f"{name}: original_max_position={original_max_position!r} must be positive")
        self.original_max_position = original_max_position
        self.beta_fast, self.beta_slow, self.truncate = beta_fast, beta_slow, truncate
        self.attention_factor = (float(attention_factor) if attention_factor is not None
                                 else yarn_attention_factor(self.scaling_factor, mscale, mscale_all_dim))
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype,
                         enforce_enable=enforce_enable)

    def _correction_dim(self, rotations: float) -> float:
        """The dim whose wavelength fits `rotations` times into original_max_position."""
        return (self.rotary_dim * math.log(self.original_max_position / (rotations * 2 * math.pi))
                / (2 * math.log(self.base)))

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        low, high = self._correction_dim(self.beta_fast), self._correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, self.rotary_dim - 1)
        if low == high:
            high += 0.001   # a ramp of one step instead of a division by zero
        ramp = ((torch.arange(self.rotary_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp    # 1: original frequency (extrapolate), 0: interpolated
        inv_freq = _inv_freq(self.rotary_dim, self.base)
        blended = inv_freq / self.scaling_factor * (1 - keep) + inv_freq * keep
        return _cache_from_inv_freq(blended, self.max_position_embeddings, self.attention_factor)


def _cos_sin(t: torch.Tensor, rotary_dim: int, base: float, dtype: torch.dtype) -> torch.Tensor:
    """cos | sin rows for (float64) positions `t`."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    freqs = torch.outer(t, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)


@CustomOp.register("dual_chunk_rotary_embedding")
class DualChunkRotaryEmbedding(CustomOp):
    """Rotary embedding for dual chunk attention (Qwen2.5-1M), following vLLM's native form.

    With `chunk_len = chunk_size - local_size`, keys rotate at `position % chunk_len`; the query
    is rotated five ways and concatenated on the last dim: intra-chunk (`position % chunk_len`),
    successive (`(position % chunk_len) + chunk_len`, clamped at chunk_size), inter (the fixed
    successive position of `chunk_len - 1`), successive-critical (unclamped) and inter-critical
    (`(position % chunk_len) + chunk_size`). As in vLLM 0.32: the caches are computed in float32 and
    cast to `dtype`; the rotation runs in the promotion of the query's and the layer's dtypes (a float32
    layer returns float32 for a half query); one token (leading dim 1) comes back without it:
    query `(5 * heads * head_size,)`, key `(kv_heads * head_size,)`.
    """

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float,
                 is_neox_style: bool, dtype: torch.dtype, chunk_size: int, local_size: int,
                 *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        _check_rotary_dims(type(self).__name__, head_size, rotary_dim, max_position_embeddings, base)
        if not 0 <= local_size < chunk_size:
            raise ValueError(f"DualChunkRotaryEmbedding: need 0 <= local_size < chunk_size, got "
                             f"local_size={local_size}, chunk_size={chunk_size}")
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        self.is_neox_style = is_neox_style
        self.dtype = dtype
        self.chunk_size = chunk_size
        self.local_size = local_size
        self.chunk_len = chunk_len = chunk_size - local_size
        t = torch.arange(chunk_len, dtype=torch.float32)
        k_t = torch.arange(max_position_embeddings, dtype=torch.float32) % chunk_len
        for name, positions in (("cos_sin_q_cache", t),
                                ("cos_sin_qc_cache", (t + chunk_len).clamp(max=chunk_size)),
                                ("cos_sin_k_cache", k_t),
                                ("cos_sin_qc_no_clamp_cache", t + chunk_len),
                                ("cos_sin_q_inter_cache", t + chunk_size)):
            self.register_buffer(name, cos_sin_rows(positions, rotary_dim, base).to(dtype), persistent=False)

    def forward_native(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                       offsets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        positions = positions + offsets if offsets is not None else positions
        # vLLM multiplies the query by the layer-dtype cos/sin: the result takes the promoted dtype.
        compute = torch.promote_types(query.dtype, self.cos_sin_q_cache.dtype)
        query, key = query.to(compute), key.to(compute)

        def rotate(pos, x, cache):
            return ir.ops.rotary_embedding_query(pos, x, self.head_size, _on_device(cache, x), self.is_neox_style)

        key_out = rotate(positions, key, self.cos_sin_k_cache)
        in_chunk = positions % self.chunk_len
        inter = torch.full_like(in_chunk, self.chunk_len - 1)
        query_out = torch.cat((
            rotate(in_chunk, query, self.cos_sin_q_cache),
            rotate(in_chunk, query, self.cos_sin_qc_cache),
            rotate(inter, query, self.cos_sin_qc_cache),
            rotate(in_chunk, query, self.cos_sin_qc_no_clamp_cache),
            rotate(in_chunk, query, self.cos_sin_q_inter_cache),
        ), dim=-1)
        return query_out.squeeze(0), key_out.squeeze(0)   # vLLM's `.squeeze(0)`: one token loses its dim

    def extra_repr(self) -> str:
        return (f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, "
                f"max_position_embeddings={self.max_position_embeddings}, base={self.base}, "
                f"is_neox_style={self.is_neox_style}, chunk_size={self.chunk_size}, local_size={self.local_size}")


@CustomOp.register("apply_rotary_emb")
class ApplyRotaryEmb(CustomOp):
    """Apply given cos/sin to `x = [(batch,) seq, heads, head_size]`; cos/sin broadcast over the
    leading dims with `head_size // 2` features (`[seq, head_size // 2]` typically).

    `enable_fp32_compute` rotates a float32 copy and casts back. Goes through IR
    `rotary_embedding_query` with one cache row per token (the given cos/sin) and positions
    `0..tokens-1`.
    """

    def __init__(self, enforce_enable: bool = False, is_neox_style: bool = True,
                 enable_fp32_compute: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        self.is_neox_style = is_neox_style
        self.enable_fp32_compute = enable_fp32_compute

    def forward_native(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2:
            raise ValueError(f"ApplyRotaryEmb expects x of shape [..., heads, head_size], got {tuple(x.shape)}")
        head_size = x.shape[-1]
        if cos.shape != sin.shape or cos.shape[-1] * 2 != head_size:
            raise ValueError(f"ApplyRotaryEmb: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must have one "
                             f"shape with head_size // 2 = {head_size // 2} features (x is {tuple(x.shape)})")
        origin_dtype = x.dtype
        if self.enable_fp32_compute:
            x = x.float()
        lead = x.shape[:-2]
        tokens = math.prod(lead)
        half = cos.shape[-1]
        cache = torch.cat((cos.expand(*lead, half).reshape(tokens, half),
                           sin.expand(*lead, half).reshape(tokens, half)), dim=-1)
        positions = torch.arange(tokens, device=x.device)
        out = ir.ops.rotary_embedding_query(positions, x, head_size, cache, self.is_neox_style)
        return out.to(origin_dtype) if self.enable_fp32_compute else out

    def extra_repr(self) -> str:
        return f"is_neox_style={self.is_neox_style}, enable_fp32_compute={self.enable_fp32_compute}"


# ----- conformance cases --------------------------------------------------------------------------
_MAX_POSITION = 4096


def _rope_case(name, tokens, q_heads, kv_heads, head_size, rotary_dim, neox, *, key=True, layout=None,
               level="quick", max_position=_MAX_POSITION, min_position=0):
    """Positions drawn from [min_position, max_position): near a large max_position the cache's float32
    angles (vLLM 0.32's build) are far from float64 ones, which a cache built otherwise shows."""
    def make_kwargs(dtype):
        return {"head_size": head_size, "rotary_dim": rotary_dim, "max_position_embeddings": max_position,
                "base": 10000.0, "is_neox_style": neox, "dtype": dtype}

    def make_inputs(dtype, device, gen):
        positions = torch.randint(min_position, max_position, (tokens,), generator=gen).to(device)
        if layout == "3d":
            q = randn((tokens, q_heads, head_size), dtype, device, gen)
            k = randn((tokens, kv_heads, head_size), dtype, device, gen)
        else:
            q = randn((tokens, q_heads * head_size), dtype, device, gen)
            k = randn((tokens, kv_heads * head_size), dtype, device, gen)
            if layout == "row_strided":
                q, k = row_strided(q, head_size), row_strided(k, 3)
        return (positions, q, k) if key else (positions, q)

    return LayerCase(name, make_kwargs, make_inputs, level=level)


declare_cases(RotaryEmbedding, tolerances=ELEMENTWISE_TOLERANCES, cases=[
    _rope_case("tokens=1,heads=1/1,head=64,neox", 1, 1, 1, 64, 64, True),
    _rope_case("tokens=7,heads=4/2,head=128,neox", 7, 4, 2, 128, 128, True),
    _rope_case("tokens=7,heads=4/2,head=128,gptj", 7, 4, 2, 128, 128, False),
    _rope_case("tokens=5,heads=3/1,head=80,rot=32,neox", 5, 3, 1, 80, 32, True),
    _rope_case("tokens=5,heads=3/1,head=80,rot=32,gptj,key=None", 5, 3, 1, 80, 32, False, key=False),
    _rope_case("tokens=6,heads=2/2,head=64,3d,neox", 6, 2, 2, 64, 64, True, layout="3d"),
    _rope_case("tokens=6,heads=2/2,head=64,row_strided,gptj", 6, 2, 2, 64, 64, False, layout="row_strided"),
    _rope_case("tokens=33,heads=8/8,head=256,neox", 33, 8, 8, 256, 256, True, level="standard"),
    # partial rotary with rotary_dim / 2 = 20 (above 8, not a multiple of 8): vLLM 0.32's CPU kernel
    # segfaults on it in bfloat16 neox style (docs/vllm.md)
    _rope_case("tokens=5,heads=2/1,head=64,rot=40,neox", 5, 2, 1, 64, 40, True),
    _rope_case("tokens=8,heads=2/1,head=64,rot=32,max_position=131072,large_positions,neox", 8, 2, 1, 64, 32, True,
               max_position=131072, min_position=100000, level="standard"),
    # partial rotary of real models (reference_impl.ir.real_models), rotary_dim / 2 = 8, 10, 12, 16 and 32
    *(_rope_case(f"tokens=5,heads=2/1,head={m.head_dim},rot={m.rotary_dim},{'neox' if m.is_neox_style else 'gptj'},"
                 f"model={m.short_name}", 5, 2, 1, m.head_dim, m.rotary_dim, m.is_neox_style, level="standard")
      for m in map(real_models.by_name, ("pythia-410m", "pythia-2.8b", "gpt-neox-20b", "phi-2", "gpt-j-6b"))),
])


def _dual_chunk_case(name, tokens, q_heads, kv_heads, head_size, rotary_dim, neox, *, offsets=False,
                     level="quick", layer_dtype=None):
    """`layer_dtype`: the layer's dtype pinned (float32 with half inputs: the output is float32)."""
    chunk_size, local_size, max_position = 64, 16, 512

    def make_kwargs(dtype):
        return {"head_size": head_size, "rotary_dim": rotary_dim, "max_position_embeddings": max_position,
                "base": 10000.0, "is_neox_style": neox, "dtype": layer_dtype or dtype, "chunk_size": chunk_size,
                "local_size": local_size}

    def make_inputs(dtype, device, gen):
        limit = max_position // 2 if offsets else max_position
        positions = torch.randint(0, limit, (tokens,), generator=gen).to(device)
        q = randn((tokens, q_heads * head_size), dtype, device, gen)
        k = randn((tokens, kv_heads * head_size), dtype, device, gen)
        if offsets:
            return (positions, q, k, torch.randint(0, limit, (tokens,), generator=gen).to(device))
        return (positions, q, k)

    return LayerCase(name, make_kwargs, make_inputs, level=level,
                     dtypes=(torch.float16, torch.bfloat16) if layer_dtype else None)


declare_cases(DualChunkRotaryEmbedding, tolerances=ELEMENTWISE_TOLERANCES, cases=[
    _dual_chunk_case("tokens=9,heads=4/2,head=64,neox", 9, 4, 2, 64, 64, True),
    _dual_chunk_case("tokens=9,heads=4/2,head=64,gptj", 9, 4, 2, 64, 64, False),
    _dual_chunk_case("tokens=5,heads=2/1,head=80,rot=32,neox,offsets", 5, 2, 1, 80, 32, True, offsets=True),
    _dual_chunk_case("tokens=1,heads=1/1,head=32,neox", 1, 1, 1, 32, 32, True),
    _dual_chunk_case("tokens=1,heads=2/1,head=64,rot=32,gptj", 1, 2, 1, 64, 32, False),
    _dual_chunk_case("tokens=6,heads=2/1,head=64,layer=float32", 6, 2, 1, 64, 64, True, layer_dtype=torch.float32),
])


def _apply_case(name, seq, heads, head_size, *, batch=None, neox=True, fp32=False, level="quick"):
    def make_inputs(dtype, device, gen):
        lead = (batch, seq) if batch else (seq,)
        x = randn((*lead, heads, head_size), dtype, device, gen)
        angles = torch.rand((seq, head_size // 2), generator=gen, dtype=torch.float64) * 2 * math.pi
        return (x, angles.cos().to(dtype).to(device), angles.sin().to(dtype).to(device))

    return LayerCase(name, lambda dtype: {"is_neox_style": neox, "enable_fp32_compute": fp32}, make_inputs,
                     level=level)


declare_cases(ApplyRotaryEmb, tolerances=ELEMENTWISE_TOLERANCES, cases=[
    _apply_case("seq=7,heads=4,head=64,neox", 7, 4, 64),
    _apply_case("seq=7,heads=4,head=64,gptj", 7, 4, 64, neox=False),
    _apply_case("batch=2,seq=5,heads=3,head=80,neox", 5, 3, 80, batch=2),
    _apply_case("seq=6,heads=2,head=32,gptj,fp32_compute", 6, 2, 32, neox=False, fp32=True),
    _apply_case("seq=1,heads=1,head=2,neox", 1, 1, 2),
])
