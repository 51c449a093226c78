"""The C++ CPU paged-attention kernels (`reference_cpu::reshape_and_cache`, `reference_cpu::paged_attention`)
against a float64 reference written here: causal offset of chunked prefill, decode, sliding window,
soft cap, ALiBi, sinks, GQA with non-power-of-2 ratios, odd head and block sizes, permuted block
tables, padded slots and rows, the null block, fp8 e4m3/e5m2 with scales, and the argument errors.
"""

from __future__ import annotations

import math

import pytest
import torch

from reference_impl.attention.cpp_backend import as_token_rows
from reference_impl.kernels import _cpp_build

FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
# Max abs error of outputs (values ~N(0,1) averaged by softmax) against float64, as vLLM's CPU tests allow.
ATOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def quantize_codes(x: torch.Tensor, scale: float, fp8: torch.dtype) -> torch.Tensor:
    """fp8 bits (uint8) of x / scale: round to nearest even, saturating (torch's cast needs the clamp)."""
    m = FP8_MAX[fp8]
    return (x.float() / scale).clamp(-m, m).to(fp8).view(torch.uint8)


def truncated_codes(x: torch.Tensor, scale: float, fp8: torch.dtype) -> torch.Tensor:
    """The codes a truncating (round-toward-zero) writer would store: the RNE code, one step toward zero
    where RNE rounded away from zero."""
    m = FP8_MAX[fp8]
    y = (x.float() / scale).clamp(-m, m)
    codes = y.to(fp8).view(torch.uint8)
    back = codes.view(fp8).float()
    away = back.abs() > y.abs()
    return torch.where(away, codes - 1, codes)


def stored_values(x: torch.Tensor, kv_cache_dtype: str, scale: float) -> torch.Tensor:
    """What the cache holds for x, as float64."""
    if kv_cache_dtype == "auto":
        return x.double()
    fp8 = FP8[kv_cache_dtype]
    return quantize_codes(x, scale, fp8).view(fp8).double() * scale


def reference(q, k_seqs, v_seqs, query_lens, *, scale, causal=True, window=-1, softcap=0.0, alibi=None,
              sinks=None, num_kv_heads):
    """float64 attention per request: q [T, H, D] rows in request order, k/v_seqs[i] [seq_len, KVH, D]."""
    heads = q.shape[1]
    group = heads // num_kv_heads
    outs = []
    row = 0
    for k, v, q_len in zip(k_seqs, v_seqs, query_lens):
        seq_len = k.shape[0]
        ctx = seq_len - q_len
        qi = q[row:row + q_len].double()
        row += q_len
        kh = k.double().repeat_interleave(group, dim=1)  # head h reads kv head h // group
        vh = v.double().repeat_interleave(group, dim=1)
        s = torch.einsum("thd,jhd->htj", qi, kh) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        p = torch.arange(q_len, dtype=torch.float64)[:, None] + ctx
        j = torch.arange(seq_len, dtype=torch.float64)[None, :]
        if alibi is not None:
            s = s - alibi.double()[:, None, None] * (p - j)[None]
        mask = torch.ones(q_len, seq_len, dtype=torch.bool)
        if causal:
            mask &= j <= p
        if window > 0:
            mask &= j > p - window
            if not causal:
                mask &= j < p + window
        s = s.masked_fill(~mask[None], -math.inf)
        if sinks is not None:
            s = torch.cat([s, sinks.double()[:, None, None].expand(heads, q_len, 1)], dim=-1)
            vh = torch.cat([vh, torch.zeros_like(vh[:1])], dim=0)
        w = torch.softmax(s, dim=-1)
        outs.append(torch.einsum("htj,jhd->thd", w, vh))
    return torch.cat(outs)


class Batch:
    """A batch over a paged cache: per request (context, new tokens), keys/values of every position,
    a permuted block table over blocks 1.. (block 0 is the null block), slots for the new tokens and
    `pad` trailing padded rows (slot -1)."""

    def __init__(self, requests, *, heads, kv_heads, head, block, dtype, pad=2, seed=0, big_key=None):
        g = torch.Generator().manual_seed(seed)
        self.requests, self.heads, self.kv_heads, self.head, self.block, self.dtype = (
            requests, heads, kv_heads, head, block, dtype)
        self.query_lens = [n for _, n in requests]
        self.seq_lens = [c + n for c, n in requests]
        blocks_per = [max(1, -(-s // block)) for s in self.seq_lens]
        width = max(blocks_per) + 1  # a spare column (0 = the null block), as a padded table has
        self.num_blocks = sum(blocks_per) + 3
        perm = (torch.randperm(self.num_blocks - 1, generator=g) + 1).tolist()
        self.block_table = torch.zeros(len(requests), width, dtype=torch.int32)
        used = 0
        for i, n in enumerate(blocks_per):
            self.block_table[i, :n] = torch.tensor(perm[used:used + n], dtype=torch.int32)
            used += n
        self.k = [torch.randn(s, kv_heads, head, generator=g).to(dtype) for s in self.seq_lens]
        self.v = [torch.randn(s, kv_heads, head, generator=g).to(dtype) for s in self.seq_lens]
        if big_key is not None:  # one value far past the fp8 range, to be saturated
            self.k[0][-1, 0, 0] = big_key
            self.v[0][-1, 0, 1] = -big_key
        t = sum(self.query_lens)
        # q split from a fused qkv row, so its token stride is not heads * head
        qkv = torch.randn(t + pad, heads + 2 * kv_heads, head, generator=g).to(dtype)
        self.q = qkv[:, :heads]
        self.qsl = torch.tensor([0, *torch.tensor(self.query_lens).cumsum(0).tolist()], dtype=torch.int32)
        self.seq_lens_t = torch.tensor(self.seq_lens, dtype=torch.int32)
        self.pad = pad

    def slot(self, i, pos):
        return int(self.block_table[i, pos // self.block]) * self.block + pos % self.block

    def context_rows(self):
        """(key, value, slots) of every request's context tokens."""
        ks, vs, slots = [], [], []
        for i, (c, _) in enumerate(self.requests):
            ks.append(self.k[i][:c])
            vs.append(self.v[i][:c])
            slots += [self.slot(i, p) for p in range(c)]
        return torch.cat(ks), torch.cat(vs), torch.tensor(slots, dtype=torch.int64)

    def new_rows(self):
        """(key, value, slots) of the new tokens plus the padded rows (slot -1, random values)."""
        ks, vs, slots = [], [], []
        for i, (c, n) in enumerate(self.requests):
            ks.append(self.k[i][c:])
            vs.append(self.v[i][c:])
            slots += [self.slot(i, p) for p in range(c, c + n)]
        junk = torch.randn(self.pad, self.kv_heads, self.head).to(self.dtype)
        return (torch.cat([*ks, junk]), torch.cat([*vs, junk]),
                torch.tensor(slots + [-1] * self.pad, dtype=torch.int64))

    def empty_cache(self, kv_cache_dtype):
        shape = (self.num_blocks, self.kv_heads, self.block, 2 * self.head)
        if kv_cache_dtype == "auto":
            return torch.full(shape, 7.0, dtype=self.dtype)  # a sentinel: untouched slots keep it
        return torch.full(shape, 0x3a, dtype=torch.uint8)


def run_case(ops, batch: Batch, *, kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0, scale=None, causal=True,
             window=-1, softcap=0.0, alibi=None, sinks=None):
    scale = batch.head ** -0.5 if scale is None else scale
    cache = batch.empty_cache(kv_cache_dtype)
    for k, v, slots in (batch.context_rows(), batch.new_rows()):
        ops.reshape_and_cache(k, v, cache, slots, kv_cache_dtype, k_scale, v_scale)
    out = torch.full((batch.q.shape[0], batch.heads, batch.head), float("nan"), dtype=batch.dtype)
    ops.paged_attention(out, batch.q, cache, batch.qsl, batch.seq_lens_t, batch.block_table, scale, causal,
                        window, softcap, alibi, sinks, kv_cache_dtype, k_scale, v_scale)
    ks = [stored_values(k, kv_cache_dtype, k_scale) for k in batch.k]
    vs = [stored_values(v, kv_cache_dtype, v_scale) for v in batch.v]
    ref = reference(batch.q, ks, vs, batch.query_lens, scale=scale, causal=causal, window=window,
                    softcap=softcap, alibi=alibi, sinks=sinks, num_kv_heads=batch.kv_heads)
    return out, ref, cache


def assert_close(out, ref, dtype, pad):
    t = ref.shape[0]
    err = (out[:t].double() - ref).abs().max().item()
    assert err <= ATOL[dtype], f"max abs error {err:.3g} > {ATOL[dtype]:.3g}"
    assert torch.isnan(out[t:]).all(), "padded output rows (past query_start_loc[-1]) were written"
    assert out.shape[0] == t + pad


# decode at 1 token, at a block boundary +1, chunked prefill with an unaligned context, a fresh
# prefill, a zero-length request, and a long-ish decode
def mixed(block):
    return [(0, 1), (block, 1), (block + 5, 9), (0, 17), (3, 0), (2 * block + 3, 1)]


FEATURES = {
    "plain": {},
    "window": {"window": 7},
    "window1": {"window": 1},
    "softcap": {"softcap": 2.0, "scale": 1.7},
    "alibi": {"alibi": True},
    "sinks": {"sinks": True},
    "window_sinks": {"window": 5, "sinks": True},
    "softcap_alibi": {"softcap": 3.0, "alibi": True},
    "noncausal": {"causal": False},
    "noncausal_window": {"causal": False, "window": 6},
}


def _features(name, heads, seed=1):
    f = dict(FEATURES[name])
    g = torch.Generator().manual_seed(seed)
    if f.pop("alibi", False):
        f["alibi"] = torch.tensor([2 ** (-8 * (h + 1) / heads) for h in range(heads)], dtype=torch.float32)
    if f.pop("sinks", False):
        f["sinks"] = torch.randn(heads, generator=g) * 2
    return f


@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_features(ops, feature, dtype):
    block = 16
    batch = Batch(mixed(block), heads=14, kv_heads=2, head=64, block=block, dtype=dtype)
    out, ref, _ = run_case(ops, batch, **_features(feature, 14))
    assert_close(out, ref, dtype, batch.pad)


@pytest.mark.parametrize("feature", list(FEATURES))
def test_features_of_an_fp32_prefill_over_blocks_of_128(ops, feature):
    """Blocks of kSpanKeys (128) keys or more are not gathered: an fp32 prefill reads them in place in AVX-512 builds
    on AMD CPUs and through key and value tiles elsewhere (reads_fp32_blocks_in_place, csrc/cpu/attention.cpp);
    whichever this machine takes, every feature over prefills that cross blocks, on and off their diagonal."""
    block = 128
    batch = Batch([(0, 1), (130, 70), (0, 200), (2 * block + 3, 1)], heads=8, kv_heads=2, head=64, block=block,
                  dtype=torch.float32)
    out, ref, _ = run_case(ops, batch, **_features(feature, 8))
    assert_close(out, ref, torch.float32, batch.pad)


@pytest.mark.parametrize("heads,kv_heads,head,block", [
    (14, 2, 128, 16), (9, 3, 80, 32), (8, 8, 48, 128), (7, 1, 96, 16), (4, 2, 256, 32), (6, 3, 40, 16),
    (3, 1, 5, 4), (8, 1, 64, 48),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_shapes(ops, heads, kv_heads, head, block, dtype):
    batch = Batch(mixed(block), heads=heads, kv_heads=kv_heads, head=head, block=block, dtype=dtype, seed=head)
    out, ref, _ = run_case(ops, batch, window=2 * block + 1, sinks=torch.randn(heads))
    assert_close(out, ref, dtype, batch.pad)


def test_long_context_and_large_prefill(ops):
    batch = Batch([(700, 1), (300, 70), (0, 45)], heads=8, kv_heads=2, head=128, block=32, dtype=torch.float32)
    out, ref, _ = run_case(ops, batch, sinks=torch.randn(8), window=400)
    assert_close(out, ref, torch.float32, batch.pad)


def test_gqa_reads_kv_head_by_division(ops):
    """Query head h reads kv head h // (H / KVH); a modulo mapping would give other values."""
    batch = Batch([(5, 3)], heads=6, kv_heads=2, head=32, block=16, dtype=torch.float32)
    out, ref, _ = run_case(ops, batch)
    assert_close(out, ref, torch.float32, batch.pad)
    modulo = [k[:, [h % 2 for h in range(6)]] for k in batch.k], [v[:, [h % 2 for h in range(6)]] for v in batch.v]
    wrong = reference(batch.q, *modulo, batch.query_lens, scale=32 ** -0.5, num_kv_heads=6)
    assert (out[:3].double() - wrong).abs().max() > 1e-2


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fp8_cache(ops, kv_cache_dtype, dtype):
    fp8 = FP8[kv_cache_dtype]
    k_scale, v_scale = 0.5, 0.25
    big = FP8_MAX[fp8] * k_scale * 4  # saturates (to +-max), where an unclamped cast gives NaN/inf
    batch = Batch(mixed(32), heads=8, kv_heads=2, head=64, block=32, dtype=dtype, big_key=big)
    out, ref, cache = run_case(ops, batch, kv_cache_dtype=kv_cache_dtype, k_scale=k_scale, v_scale=v_scale,
                               sinks=torch.randn(8))
    assert torch.isfinite(out[:ref.shape[0]]).all()
    assert_close(out, ref, dtype, batch.pad)
    # the saturating value's code is the largest finite one
    slot = batch.slot(0, batch.seq_lens[0] - 1)
    code = as_token_rows(cache)[slot // 32, 0, slot % 32, 0].view(fp8).float().item()
    assert code == FP8_MAX[fp8]


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_writer_rounds_to_nearest_even(ops, kv_cache_dtype):
    """The stored codes are exactly torch's RNE codes; the test data has values where truncation differs."""
    fp8 = FP8[kv_cache_dtype]
    g = torch.Generator().manual_seed(3)
    k = torch.randn(40, 2, 32, generator=g) * 3
    v = torch.randn(40, 2, 32, generator=g)
    cache = torch.zeros(4, 2, 16, 64, dtype=torch.uint8)
    slots = torch.randperm(48, generator=g)[:40] + 16  # blocks 1..3
    ops.reshape_and_cache(k, v, cache, slots, kv_cache_dtype, 0.75, 0.3)
    blk, off = slots // 16, slots % 16
    rows = as_token_rows(cache)
    got_k = rows[blk, :, off, :32]
    got_v = rows[blk, :, off, 32:]
    assert torch.equal(got_k, quantize_codes(k, 0.75, fp8))
    assert torch.equal(got_v, quantize_codes(v, 0.3, fp8))
    assert not torch.equal(got_k, truncated_codes(k, 0.75, fp8)), "test data cannot tell RNE from truncation"
    assert (cache[0] == 0).all(), "the null block was written"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_writer_touches_only_addressed_slots(ops, dtype):
    batch = Batch(mixed(16), heads=4, kv_heads=2, head=48, block=16, dtype=dtype)
    cache = batch.empty_cache("auto")
    before = cache.clone()
    k, v, slots = batch.new_rows()
    assert (slots < 0).sum() == batch.pad
    ops.reshape_and_cache(k, v, cache, slots, "auto", 1.0, 1.0)
    expected = as_token_rows(before)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            expected[s // 16, :, s % 16, :48] = k[t]
            expected[s // 16, :, s % 16, 48:] = v[t]
    assert torch.equal(as_token_rows(cache), expected)
    assert torch.equal(cache[0], before[0]), "the null block was written"
    written = cache.clone()
    ops.reshape_and_cache(k, v, cache, torch.full_like(slots, -1), "auto", 1.0, 1.0)
    assert torch.equal(cache, written), "all -1 slots changed the cache"


def test_strided_key_value_and_cache_view(ops):
    """k/v split from a fused qkv, and a cache that is one layer's view of a cross-layer buffer
    ([block, layer, head, token, 2 * head_size]: the block stride spans both layers)."""
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(6, 4 + 2 * 2, 32, generator=g)
    k, v = qkv[:, 4:6], qkv[:, 6:8]
    buf = torch.zeros(3, 2, 2, 8, 64)
    cache = buf[:, 1]  # [3, 2, 8, 64], block stride 2048
    slots = torch.tensor([8, 9, 10, 17, 23, -1])
    ops.reshape_and_cache(k, v, cache, slots, "auto", 1.0, 1.0)
    rows = as_token_rows(cache)
    assert torch.equal(rows[1, :, 0, :32], k[0]) and torch.equal(rows[2, :, 7, 32:], v[4])
    assert (buf[:, 0] == 0).all(), "the other layer was written"
    query = torch.randn(1, 4, 32, generator=g)
    out = torch.empty_like(query)
    ops.paged_attention(out, query, cache, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([3], dtype=torch.int32),
                        torch.tensor([[1]], dtype=torch.int32), 0.25, True, -1, 0.0, None, None, "auto", 1.0, 1.0)
    keys, values = k[:3].repeat_interleave(2, dim=1), v[:3].repeat_interleave(2, dim=1)  # GQA: 2 heads a kv head
    probs = torch.softmax(0.25 * torch.einsum("hd,thd->ht", query[0], keys), dim=-1)
    torch.testing.assert_close(out[0], torch.einsum("ht,thd->hd", probs, values), rtol=1e-5, atol=1e-5)


def test_a_cache_whose_token_rows_are_apart_is_refused(ops):
    """The kernels pack each (block, head) of the cache their own way, so its token rows must be contiguous."""
    k = torch.randn(2, 2, 32)
    cache = torch.zeros(3, 2, 8, 2, 64)[:, :, :, 1]  # [3, 2, 8, 64], token stride 128
    with pytest.raises(RuntimeError, match=r"each block of kv_cache must be contiguous per head \(token stride 128"):
        ops.reshape_and_cache(k, k, cache, torch.tensor([8, 9]), "auto", 1.0, 1.0)


def test_errors_name_the_problem(ops):
    batch = Batch([(3, 2)], heads=4, kv_heads=2, head=16, block=8, dtype=torch.float32)
    cache = batch.empty_cache("auto")
    k, v, slots = batch.new_rows()
    out = torch.empty(batch.q.shape)
    args = dict(scale=0.25, causal=True, window=-1, cap=0.0, alibi=None, sinks=None, kvd="auto")

    def attend(**over):
        a = {**args, **over}
        ops.paged_attention(a.get("out", out), a.get("q", batch.q), a.get("cache", cache),
                            a.get("qsl", batch.qsl), a.get("lens", batch.seq_lens_t), a.get("bt", batch.block_table),
                            a["scale"], a["causal"], a["window"], a["cap"], a["alibi"], a["sinks"], a["kvd"], 1.0,
                            1.0)

    with pytest.raises(RuntimeError, match="kv_cache_dtype 'fp4' is not supported"):
        attend(kvd="fp4")
    with pytest.raises(RuntimeError, match="kv_cache dtype Float must be uint8"):
        attend(kvd="fp8")
    with pytest.raises(RuntimeError, match="num_heads 3 is not a multiple"):
        attend(q=batch.q[:, :3], out=out[:, :3])
    with pytest.raises(RuntimeError, match="seq_len 1 below its query length 2"):
        attend(lens=torch.tensor([1], dtype=torch.int32))
    with pytest.raises(IndexError, match=r"block_table\[0, 0\] = 99 is outside"):
        attend(bt=torch.full_like(batch.block_table, 99))
    with pytest.raises(RuntimeError, match="needs 1 blocks for seq_len 5 but block_table has 0 columns"):
        attend(bt=batch.block_table[:, :0])
    with pytest.raises(RuntimeError, match="sliding_window must be -1"):
        attend(window=0)
    with pytest.raises(RuntimeError, match="logits_soft_cap must be 0"):
        attend(cap=-1.0)
    with pytest.raises(RuntimeError, match=r"sinks must be a float CPU tensor of shape \[4\]"):
        attend(sinks=torch.zeros(3))
    with pytest.raises(RuntimeError, match="query_start_loc must be a CPU Int tensor"):
        attend(qsl=batch.qsl.long())
    with pytest.raises(RuntimeError, match="output dtype BFloat16 differs"):
        attend(out=out.bfloat16())
    with pytest.raises(IndexError, match=r"slot_mapping\[0\] = 1000 is past"):
        ops.reshape_and_cache(k, v, cache, torch.full_like(slots, 1000), "auto", 1.0, 1.0)
    with pytest.raises(RuntimeError, match="k_scale and v_scale must be finite and positive"):
        ops.reshape_and_cache(k, v, cache, slots, "auto", 0.0, 1.0)
    with pytest.raises(RuntimeError, match="must equal the activation dtype"):
        ops.reshape_and_cache(k.half(), v.half(), cache, slots, "auto", 1.0, 1.0)


# bf16 caches with head and block sizes multiples of 32: on a CPU with AMX-BF16 (AVX512_BF16 build) the kernels
# keep them in pairs for the AMX tiles and every task (decode and prefill) reads them in place; elsewhere these
# take the usual paths. Blocks of 16 (test_features) take the AMX path only for prefills, through packed copies.
@pytest.mark.parametrize("feature", list(FEATURES))
def test_bf16_blocks_of_32(ops, feature):
    batch = Batch(mixed(32) + [(40, 33)], heads=8, kv_heads=2, head=64, block=32, dtype=torch.bfloat16)
    out, ref, _ = run_case(ops, batch, **_features(feature, 8))
    assert_close(out, ref, torch.bfloat16, batch.pad)


@pytest.mark.parametrize("block", [16, 32])
@pytest.mark.parametrize("feature", ["plain", "window_sinks", "softcap_alibi"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_scratch_is_written_before_it_is_read(ops, monkeypatch, kv_cache_dtype, dtype, feature, block):
    """The kernel's per-call scratch (accumulators, query lanes, scores, tiles, fp8 blocks decoded, and the AMX
    path's query rows, probabilities and last values step) is not zeroed; with REFERENCE_CPU_POISON_SCRATCH=1 the
    kernel fills it with NaN first, so any read before a write would show in the output. Decodes and prefills
    (tiled and not), blocks of 16 and 32 (bf16 blocks of 32 are read in place by the AMX path where the CPU has
    AMX-BF16, blocks of 16 through packed copies), every activation dtype, a 16-bit and an fp8 cache."""
    monkeypatch.setenv("REFERENCE_CPU_POISON_SCRATCH", "1")
    batch = Batch(mixed(block) + [(40, 33), (0, 17)], heads=8, kv_heads=2, head=64, block=block, dtype=dtype,
                  seed=block)
    out, ref, _ = run_case(ops, batch, kv_cache_dtype=kv_cache_dtype, **_features(feature, 8))
    assert_close(out, ref, dtype, batch.pad)


@pytest.mark.parametrize("window", [-1, 200])
def test_fp32_prefill_reads_blocks_in_place_or_through_tiles_with_the_same_bits(ops, monkeypatch, window):
    """An fp32 prefill over blocks of 128 keys either copies each block into key and value tiles or (AVX-512 builds,
    chosen by the CPU's L1 size and vendor) reads it in place; REFERENCE_CPU_PREFILL_TILES=1 / 0 forces either. Both
    are right, their scores and sums run in the same order, so in AVX-512 builds they agree bit for bit (the AVX2
    build has only the tiles). Scratch poisoned: neither reads a tile or score before writing it."""
    monkeypatch.setenv("REFERENCE_CPU_POISON_SCRATCH", "1")
    batch = Batch([(300, 70), (0, 200), (128, 1), (5, 130)], heads=8, kv_heads=2, head=128, block=128,
                  dtype=torch.float32, seed=7)
    outs = {}
    for tiles in ("1", "0"):
        monkeypatch.setenv("REFERENCE_CPU_PREFILL_TILES", tiles)
        outs[tiles], ref, _ = run_case(ops, batch, window=window)
        assert_close(outs[tiles], ref, torch.float32, batch.pad)
    if _cpp_build.isa().startswith("AVX512"):   # the rows written (the padded ones are left NaN)
        rows = sum(batch.query_lens)
        assert torch.equal(outs["1"][:rows], outs["0"][:rows])


def test_bf16_paired_layout_round_trip(ops):
    """The writer's slots read back as token rows (as_token_rows follows the paired layout where it is used),
    and the paired layout is [D/2, N, 2] keys then [N/2, D, 2] values inside each (block, head)."""
    batch = Batch(mixed(32), heads=4, kv_heads=2, head=64, block=32, dtype=torch.bfloat16)
    cache = batch.empty_cache("auto")
    before = cache.clone()
    k, v, slots = batch.new_rows()
    ops.reshape_and_cache(k, v, cache, slots, "auto", 1.0, 1.0)
    expected = as_token_rows(before)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            expected[s // 32, :, s % 32, :64] = k[t]
            expected[s // 32, :, s % 32, 64:] = v[t]
    assert torch.equal(as_token_rows(cache), expected)
    if ops.paged_cache_pairs(cache):
        s = next(s for s in slots.tolist() if s >= 0 and s % 2 == 1)
        t = slots.tolist().index(s)
        flat = cache[s // 32, 1].reshape(-1)
        o = s % 32
        assert torch.equal(flat[[(d // 2) * 64 + 2 * o + d % 2 for d in range(64)]], k[t, 1])
        assert torch.equal(flat[[32 * 64 + (o // 2) * 128 + 2 * d + o % 2 for d in range(64)]], v[t, 1])
    assert not ops.paged_cache_pairs(cache.float()) and not ops.paged_cache_pairs(cache[:, :, :16])


def test_the_paired_layout_is_used_exactly_where_the_cpu_has_amx_bf16(ops):
    """What the machine has decides, not what the kernels report of themselves: AMX-BF16 in the CPU's flags, a build
    for AVX512_BF16 and the path not turned off (REFERENCE_CPU_NO_AMX) mean pairs; anything else, the usual layout."""
    import os

    with open("/proc/cpuinfo") as f:
        flags = {flag for line in f if line.startswith("flags") for flag in line.split(":", 1)[1].split()}
    off = os.environ.get("REFERENCE_CPU_NO_AMX", "") not in ("", "0")
    expected = {"amx_bf16", "amx_tile"} <= flags and _cpp_build.isa() == "AVX512_BF16" and not off
    assert ops.paged_cache_pairs(torch.zeros(2, 2, 32, 128, dtype=torch.bfloat16)) is expected


@pytest.mark.parametrize("block", [16, 32])
def test_bf16_error_against_float64(ops, block):
    """bf16 rounds the output once; the AMX path also rounds the probabilities to bf16 (their sum is of the
    unrounded ones, as vLLM's kernel sums them), which adds at most about one output ulp. Measured on the development
    VM (AMX) for this case, blocks of 16 / 32: max 7.2e-3 / 5.2e-3 (the output's own rounding), mean 2.75e-4 / 2.72e-4
    (1.9e-4 with fp32 probabilities), at most 4.3e-3 / 3.5e-3 past the output's rounding (3.8e-3 / 2.3e-3 with the
    sum of the rounded probabilities; 5e-7 with fp32 probabilities)."""
    batch = Batch([(0, 200), (130, 70), (300, 1), (511, 1)], heads=8, kv_heads=2, head=128, block=block,
                  dtype=torch.bfloat16, seed=11)
    out, ref, _ = run_case(ops, batch, sinks=torch.randn(8, generator=torch.Generator().manual_seed(2)))
    err = (out[:ref.shape[0]].double() - ref).abs()
    rounding = (ref.bfloat16().double() - ref).abs()  # the output's own rounding
    assert err.max().item() <= 1e-2, err.max().item()
    assert err.mean().item() <= 4e-4, err.mean().item()
    assert (err - rounding).max().item() <= 5e-3, (err - rounding).max().item()


@pytest.mark.parametrize("block", [16, 32])
@pytest.mark.parametrize("feature", ["plain", "sinks", "softcap_alibi"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_nan_reaches_exactly_the_outputs_whose_softmax_it_enters(ops, dtype, feature, block):
    """A NaN query element makes every score of its (token, head) NaN, and so its whole output row; a NaN key
    element makes NaN the rows of its kv head's query heads that see that position, and no other. Every other row
    matches the float64 reference. (A lane whose scores were all NaN once kept -inf as its running max and wrote
    zeros; a NaN beside finite scores came out finite from the AVX2 exponential, whose clamp made it 2^127.)"""
    batch = Batch([(0, 40), (37, 1), (70, 20), (block, 1)], heads=8, kv_heads=2, head=64, block=block, dtype=dtype,
                  seed=5)
    nan = float("nan")
    batch.q[3, 5, 7] = nan        # request 0 (a prefill), token 3, head 5
    batch.q[40, 2, 0] = nan       # request 1 (a decode), head 2
    batch.k[0][30, 0, 3] = nan    # request 0, position 30, kv head 0: rows 30..39 of heads 0..3
    batch.k[2][50, 1, 9] = nan    # request 2, a context position, kv head 1: all 20 rows of heads 4..7
    out, ref, _ = run_case(ops, batch, **_features(feature, 8))
    t = ref.shape[0]
    expected = torch.isnan(ref).any(-1)
    assert expected.sum().item() == 1 + 1 + 10 * 4 + 20 * 4   # the float64 reference agrees with the docstring
    got = torch.isnan(out[:t])
    assert torch.equal(got.any(-1), expected), (
        f"NaN rows (token, head) expected {expected.nonzero().tolist()}, got {got.any(-1).nonzero().tolist()}")
    assert got[expected].all(), "a row with a NaN score is NaN only in part"
    keep = ~expected[..., None].expand_as(ref)
    err = (out[:t].double() - ref)[keep].abs().max().item()
    assert err <= ATOL[dtype], f"max abs error {err:.3g} on the rows without NaN"
