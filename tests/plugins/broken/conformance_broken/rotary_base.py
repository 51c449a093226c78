"""Shared pieces of the rotary fixtures: rotary embedding computed in a chosen dtype and rounded once."""

import torch


def rope(positions, x, head_size, cos_sin_cache, is_neox_style, compute_dtype=torch.float32):
    """Rotate the first rotary_dim features of each head, computing in `compute_dtype`, rounding once at the end."""
    rot = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache.index_select(0, positions.flatten()).to(compute_dtype).chunk(2, dim=-1)
    heads = x.reshape(positions.numel(), -1, head_size).to(compute_dtype)
    part = heads[..., :rot]
    if is_neox_style:
        x1, x2 = part.chunk(2, dim=-1)
    else:
        x1, x2 = part[..., ::2], part[..., 1::2]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    rotated = torch.cat((o1, o2), dim=-1) if is_neox_style else torch.stack((o1, o2), dim=-1).flatten(-2)
    return torch.cat((rotated, heads[..., rot:]), dim=-1).reshape(x.shape).to(x.dtype)


def make_rotary_kernels(transform=lambda positions, x, head_size, cache, neox: (cache, neox),
                        compute_dtype=torch.float32, supports_args=None):
    """Register rotary_embedding as provider 'broken': `transform` may alter the cache and style it uses."""
    from reference_impl import ir

    @ir.ops.rotary_embedding.register_impl("broken", supports_args=supports_args)
    def rotary_embedding(positions, x_query, x_key, head_size, cos_sin_cache, is_neox_style):
        cache, neox = transform(positions, x_query, head_size, cos_sin_cache, is_neox_style)
        return (rope(positions, x_query, head_size, cache, neox, compute_dtype),
                rope(positions, x_key, head_size, cache, neox, compute_dtype))

    return rotary_embedding
