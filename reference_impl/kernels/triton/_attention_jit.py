"""Triton kernels of paged attention: the KV-cache writer and the forward (one program per query token and
query head; keys in tiles of BLOCK_N gathered through the block table; online softmax in float32; the
output rounded once). Layout and semantics: reference_impl/kernels/triton/attention.py."""

import triton
import triton.language as tl

from reference_impl.kernels.triton._jit_common import round_to, tanh


@triton.jit
def reshape_and_cache_kernel(k_ptr, k_s0, k_s1, v_ptr, v_s0, v_s1, kv_ptr, kv_s0, kv_s1, kv_s2, slot_ptr,
                             head_size, block_size, BLOCK_D: tl.constexpr):
    """kv[slot // N, h, slot % N, :D] = key[t, h], [..., D:] = value[t, h] for token t, kv head h; slot < 0
    writes nothing."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    mask = (d < head_size) & ((d.to(tl.int64) * 0 + slot) >= 0)
    safe = tl.maximum(slot, 0)
    dst = kv_ptr + (safe // block_size) * kv_s0 + h * kv_s1 + (safe % block_size) * kv_s2 + d
    k = tl.load(k_ptr + t * k_s0 + h * k_s1 + d, mask=mask, other=0.0)
    v = tl.load(v_ptr + t * v_s0 + h * v_s1 + d, mask=mask, other=0.0)
    tl.store(dst, k.to(kv_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + head_size, v.to(kv_ptr.dtype.element_ty), mask=mask)


@triton.jit
def paged_attention_kernel(out_ptr, out_s0, out_s1, q_ptr, q_s0, q_s1, kv_ptr, kv_s0, kv_s1, kv_s2,
                           token_seq_ptr, qsl_ptr, seq_lens_ptr, bt_ptr, bt_s0, alibi_ptr, sinks_ptr,
                           scale, softcap, window, head_size, block_size, group,
                           CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                           HAS_ALIBI: tl.constexpr, HAS_SINKS: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[t, h] = softmax over the keys query t (position p) may see of scale * q.k (soft-capped, then
    ALiBi), with sink h as an extra logit of value 0, times the values; kv head h // group."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    seq = tl.load(token_seq_ptr + t).to(tl.int64)
    q_start = tl.load(qsl_ptr + seq)
    q_end = tl.load(qsl_ptr + seq + 1)
    seq_len = tl.load(seq_lens_ptr + seq)
    pos = seq_len - (q_end - q_start) + (t.to(tl.int32) - q_start)
    kvh = h // group
    d = tl.arange(0, BLOCK_D)
    dmask = d < head_size
    q = tl.load(q_ptr + t * q_s0 + h * q_s1 + d, mask=dmask, other=0.0).to(tl.float32)
    if CAUSAL:
        hi = pos
    else:
        hi = seq_len - 1
    lo = pos * 0
    if HAS_WINDOW:
        lo = tl.maximum(pos - window + 1, 0)
        if not CAUSAL:
            hi = tl.minimum(hi, pos + window - 1)
    if HAS_SINKS:
        m = tl.load(sinks_ptr + h).to(tl.float32)
        l = m * 0.0 + 1.0  # e^(sink - m), m = sink
    else:
        m = (pos * 0).to(tl.float32) - float("inf")
        l = (pos * 0).to(tl.float32)
    if HAS_ALIBI:
        slope = tl.load(alibi_ptr + h).to(tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for j0 in range(lo, hi + 1, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        jmask = j <= hi
        blk = tl.load(bt_ptr + seq * bt_s0 + j // block_size, mask=jmask, other=0).to(tl.int64)
        row = kv_ptr + blk * kv_s0 + kvh * kv_s1 + (j % block_size).to(tl.int64) * kv_s2
        kvmask = jmask[:, None] & dmask[None, :]
        k = tl.load(row[:, None] + d[None, :], mask=kvmask, other=0.0).to(tl.float32)
        v = tl.load(row[:, None] + head_size + d[None, :], mask=kvmask, other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale
        if HAS_SOFTCAP:
            s = softcap * tanh(s / softcap)
        if HAS_ALIBI:
            s = s - slope * (pos - j).to(tl.float32)
        s = tl.where(jmask, s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        l = l * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    o = acc / l
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    tl.store(out_ptr + t * out_s0 + h * out_s1 + d, round_to(o, DTYPE).to(DTYPE), mask=dmask)
