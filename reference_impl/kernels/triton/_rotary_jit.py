"""Triton kernel of rotary embedding: one program rotates every head of one token, in place."""

import triton
import triton.language as tl

from reference_impl.kernels.triton._jit_common import round_to


@triton.jit
def _rotate_heads(x_ptr, tok, s_tok, s_head, s_dim, num_heads, cos, sin, half,
                  IS_NEOX: tl.constexpr, HEADS_BLOCK: tl.constexpr, HALF_BLOCK: tl.constexpr):
    DT: tl.constexpr = x_ptr.dtype.element_ty
    heads = tl.arange(0, HEADS_BLOCK)[:, None]
    base = x_ptr + tok * s_tok + heads * s_head
    if IS_NEOX:
        idx = tl.arange(0, HALF_BLOCK)[None, :]
        mask = (heads < num_heads) & (idx < half)
        p1 = base + idx * s_dim
        p2 = base + (idx + half) * s_dim
        x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
    else:
        # GPT-J pairs (2i, 2i+1) are adjacent: one contiguous load of the 2*half features, split in
        # registers (two strided loads would compile to scalar accesses), joined again to store.
        pair_idx = tl.arange(0, 2 * HALF_BLOCK)[None, :]
        pair_mask = (heads < num_heads) & (pair_idx < 2 * half)
        pairs = base + pair_idx * s_dim
        x1, x2 = tl.split(tl.reshape(tl.load(pairs, mask=pair_mask, other=0.0).to(tl.float32),
                                     (HEADS_BLOCK, HALF_BLOCK, 2)))
    # Native: o1 = x1 * cos - x2 * sin, o2 = x2 * cos + x1 * sin, each op rounded to x's dtype.
    o1 = round_to(round_to(x1 * cos, DT) - round_to(x2 * sin, DT), DT)
    o2 = round_to(round_to(x2 * cos, DT) + round_to(x1 * sin, DT), DT)
    if IS_NEOX:
        tl.store(p1, o1.to(DT), mask=mask)
        tl.store(p2, o2.to(DT), mask=mask)
    else:
        tl.store(pairs, tl.reshape(tl.join(o1, o2), (HEADS_BLOCK, 2 * HALF_BLOCK)).to(DT), mask=pair_mask)


@triton.jit
def rotary_kernel(pos_ptr, q_ptr, q_s_tok, q_s_head, q_s_dim, q_heads,
                  k_ptr, k_s_tok, k_s_head, k_s_dim, k_heads,
                  cache_ptr, cache_s_row, cache_s_col, half,
                  IS_NEOX: tl.constexpr, HAS_KEY: tl.constexpr,
                  Q_HEADS_BLOCK: tl.constexpr, K_HEADS_BLOCK: tl.constexpr, HALF_BLOCK: tl.constexpr):
    """Rotate the first 2*half features of each head of token `program_id(0)` of q (and k)."""
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    idx = tl.arange(0, HALF_BLOCK)[None, :]
    cmask = idx < half
    row = cache_ptr + pos * cache_s_row
    cos = tl.load(row + idx * cache_s_col, mask=cmask, other=0.0).to(tl.float32)
    sin = tl.load(row + (idx + half) * cache_s_col, mask=cmask, other=0.0).to(tl.float32)
    # Native casts cos/sin to the activation dtype before multiplying.
    qcos = round_to(cos, q_ptr.dtype.element_ty)
    qsin = round_to(sin, q_ptr.dtype.element_ty)
    _rotate_heads(q_ptr, tok, q_s_tok, q_s_head, q_s_dim, q_heads, qcos, qsin, half,
                  IS_NEOX, Q_HEADS_BLOCK, HALF_BLOCK)
    if HAS_KEY:
        kcos = round_to(cos, k_ptr.dtype.element_ty)
        ksin = round_to(sin, k_ptr.dtype.element_ty)
        _rotate_heads(k_ptr, tok, k_s_tok, k_s_head, k_s_dim, k_heads, kcos, ksin, half,
                      IS_NEOX, K_HEADS_BLOCK, HALF_BLOCK)
