"""RotaryEmbedding's context-extension variants: LinearScalingRotaryEmbedding,
DynamicNTKScalingRotaryEmbedding, Llama3RotaryEmbedding and YaRNScalingRotaryEmbedding, with the
formulas of transformers' rope init functions / vLLM. They only change the cos/sin cache
(`_compute_cos_sin_cache`) and are subclasses, not registered names of their own (as in vLLM), so
they run wherever RotaryEmbedding runs and its conformance cases cover their rotation.
"""

from __future__ import annotations

import math

import torch

from reference_impl.layers.rotary_embedding.base import RotaryEmbedding


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
