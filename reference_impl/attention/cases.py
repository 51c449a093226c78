"""The attention cases: a batch (query and sequence lengths) and a layer configuration, drawn from the case
dimensions of the spec (docs/attention.md, "Cases"); each says what bug it catches.

A case runs at its level and above (quick ⊂ standard ⊂ full) with the KV-cache dtypes it lists, for every
backend whose declarations admit it (`admits`). Batches are small: a case is milliseconds on a CPU, except the
size cases (reference_impl.attention.size_cases: 4,097 to 1,048,577 tokens or requests, a cache past 65,535 blocks),
which keep one tiny head and run in one dtype.
"""

from __future__ import annotations

import dataclasses

import torch

from reference_impl.attention import size_cases
from reference_impl.attention.backend import AttentionSelectorConfig, AttentionType

LEVEL_ORDER = ("quick", "standard", "full")
SPELLED_REQUESTS = 16     # a batch of more requests is described by its counts and ranges
# A case about size alone (the size cases: a limit on tokens, requests or blocks, whatever the element type) runs in
# one dtype, the first of these the backend declares, so the standard run stays cheap.
ONE_DTYPE_ORDER = (torch.bfloat16, torch.float16, torch.float32)
FP8 = ("fp8_e4m3", "fp8_e5m2")


@dataclasses.dataclass(frozen=True)
class AttentionCase:
    name: str
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    catches: str
    num_heads: int = 4
    num_kv_heads: int = 2
    head_size: int = 64
    block_size: int = 16
    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    alibi: bool = False
    sinks: bool = False
    scale: float | None = None            # None: head_size ** -0.5
    causal: bool = True
    attn_type: str = AttentionType.DECODER
    padding: int = 3                      # trailing padded tokens (slot -1) past num_actual_tokens
    max_seq_len_extra: int = 0            # max_seq_len given as an upper bound this much above the true one
    shared_prefix_blocks: int = 0         # requests 0 and 1 share this many leading blocks (prefix caching)
    fused_qkv: bool = False               # q, k, v as views split from one [T, (H + 2 KVH) D] tensor
    kv_dtypes: tuple[str, ...] = ("auto",)
    k_scale: float = 0.5                  # fp8 only (1.0 for "auto")
    v_scale: float = 0.25
    level: str = "quick"
    first_block: int = 1                  # the smallest block the batch's requests use (below it: never addressed)
    memory_bytes: int | None = None       # free host (and device) bytes running and judging it needs; None: small
    one_dtype: bool = False               # graded in one dtype: the first of ONE_DTYPE_ORDER the backend declares

    def __post_init__(self):
        if len(self.query_lens) != len(self.seq_lens):
            raise ValueError(f"case {self.name}: {len(self.query_lens)} query lengths, {len(self.seq_lens)} seq lengths")
        if any(q > s for q, s in zip(self.query_lens, self.seq_lens)):
            raise ValueError(f"case {self.name}: a query length exceeds its sequence length")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"case {self.name}: num_heads {self.num_heads} not a multiple of {self.num_kv_heads}")
        if self.level not in LEVEL_ORDER:
            raise ValueError(f"case {self.name}: level {self.level!r} is not one of {LEVEL_ORDER}")
        if self.first_block < 1:
            raise ValueError(f"case {self.name}: first_block {self.first_block} must be >= 1 (block 0 is the null "
                             "block)")

    def runs_at(self, level: str) -> bool:
        return LEVEL_ORDER.index(self.level) <= LEVEL_ORDER.index(level)

    @property
    def softmax_scale(self) -> float:
        return self.head_size ** -0.5 if self.scale is None else self.scale

    @property
    def encoder(self) -> bool:
        return self.attn_type in (AttentionType.ENCODER, AttentionType.ENCODER_ONLY)

    def selector_config(self, dtype, kv_cache_dtype: str) -> AttentionSelectorConfig:
        """What a layer of this case asks its platform for (the user did not pick a block size)."""
        return AttentionSelectorConfig(head_size=self.head_size, dtype=dtype, kv_cache_dtype=kv_cache_dtype,
                                       block_size=None, has_sink=self.sinks, attn_type=self.attn_type,
                                       has_sliding_window=self.sliding_window is not None,
                                       use_non_causal=not self.causal)

    def features(self) -> list[str]:
        """The optional features the case exercises, by the names docs/attention.md uses."""
        named = [("sliding_window", self.sliding_window is not None), ("logits_soft_cap", bool(self.logits_soft_cap)),
                 ("alibi", self.alibi), ("sinks", self.sinks), ("non_causal", not self.causal),
                 (f"attn_type={AttentionType(self.attn_type).value}", self.attn_type != AttentionType.DECODER)]
        return [n for n, on in named if on]

    def describe(self, kv_cache_dtype: str = "auto") -> str:
        parts = [self._batch_text(), f"H={self.num_heads} KVH={self.num_kv_heads} D={self.head_size} block={self.block_size}"]
        if self.sliding_window is not None:
            parts.append(f"sliding_window={self.sliding_window}")
        if self.logits_soft_cap:
            parts.append(f"logits_soft_cap={self.logits_soft_cap:g}")
        if self.alibi:
            parts.append("alibi")
        if self.sinks:
            parts.append("sinks")
        if self.scale is not None:
            parts.append(f"scale={self.scale:.4g}")
        if not self.causal:
            parts.append("causal=False")
        if self.attn_type != AttentionType.DECODER:
            parts.append(f"attn_type={AttentionType(self.attn_type).value}")
        if kv_cache_dtype != "auto":
            parts.append(f"kv_cache_dtype={kv_cache_dtype} k_scale={self.k_scale:g} v_scale={self.v_scale:g}")
        if self.max_seq_len_extra:
            parts.append(f"max_seq_len={max(self.seq_lens) + self.max_seq_len_extra} (an upper bound: "
                         f"the longest sequence is {max(self.seq_lens)})")
        if self.shared_prefix_blocks:
            parts.append(f"requests 0 and 1 share {self.shared_prefix_blocks} prefix block(s)")
        if self.fused_qkv:
            parts.append("q/k/v strided views of one fused qkv tensor")
        if self.first_block > 1:
            parts.append(f"the batch's blocks numbered from {self.first_block} up")
        if self.padding:
            parts.append(f"{self.padding} padded tokens (slot -1)")
        return ", ".join(parts)

    def _batch_text(self) -> str:
        """The lengths, spelled out for a small batch and summarised for a large one (a size case)."""
        if len(self.query_lens) <= SPELLED_REQUESTS:
            return f"query_lens={list(self.query_lens)} seq_lens={list(self.seq_lens)}"
        return (f"{len(self.query_lens)} requests, {sum(self.query_lens)} tokens (query_lens "
                f"{min(self.query_lens)}..{max(self.query_lens)}, seq_lens {min(self.seq_lens)}..{max(self.seq_lens)})")


CASES: list[AttentionCase] = [
    # ----- quick ----------------------------------------------------------------------------------
    AttentionCase("decode", (1, 1, 1, 1), (1, 16, 17, 45), "decode: first token, block boundary (=block, block+1)",
                  num_heads=8, num_kv_heads=2, kv_dtypes=("auto", "fp8_e4m3")),
    AttentionCase("chunked_prefill", (9, 17, 0), (49, 17, 23),
                  "chunked prefill: causal offset by the context (40, not block-aligned), a fresh prefill, a "
                  "trailing zero-length request", num_heads=4, num_kv_heads=4, kv_dtypes=("auto", "fp8_e5m2")),
    AttentionCase("mixed_window", (1, 1, 9, 17), (64, 33, 49, 17), "sliding window (13 < context, not block-aligned) "
                  "in decode and prefill", num_heads=6, num_kv_heads=3, head_size=80, sliding_window=13),
    AttentionCase("softcap_alibi", (1, 7), (40, 30), "soft cap small against the logits, ALiBi", num_heads=4,
                  num_kv_heads=1, logits_soft_cap=5.0, alibi=True, scale=0.5),
    AttentionCase("sinks_window", (1, 11), (70, 26), "sinks with a sliding window (gpt-oss)", num_heads=8,
                  num_kv_heads=1, sinks=True, sliding_window=16, kv_dtypes=("auto", "fp8_e4m3")),
    AttentionCase("inflated_max_seq_len", (1, 5), (21, 30), "max_seq_len as an upper bound: a backend reading "
                  "keys past seq_lens up to max_seq_len", max_seq_len_extra=37),
    # ----- standard -------------------------------------------------------------------------------
    AttentionCase("gqa_ratio7", (1, 6, 1), (35, 20, 50), "GQA with a non-power-of-2 ratio (Qwen2 14/2)",
                  num_heads=14, num_kv_heads=2, level="standard"),
    AttentionCase("gqa_9_3_block32", (3, 1), (70, 41), "GQA 9/3, head size 96, block 32", num_heads=9,
                  num_kv_heads=3, head_size=96, block_size=32, level="standard"),
    AttentionCase("head128_block64", (1, 13), (130, 77), "head size 128, block 64, GQA 6/3", num_heads=6,
                  num_kv_heads=3, head_size=128, block_size=64, kv_dtypes=("auto", "fp8_e4m3"), level="standard"),
    AttentionCase("head256_mqa", (1, 4), (37, 9), "head size 256, MQA 8/1 (Gemma-2 shape)", num_heads=8,
                  num_kv_heads=1, head_size=256, level="standard"),
    AttentionCase("head112", (2, 1), (19, 33), "head size 112 (a tail past 64)", num_heads=2, num_kv_heads=2,
                  head_size=112, level="standard"),
    AttentionCase("multi_token_decode", (2, 3, 4, 5, 6), (300, 201, 150, 97, 64),
                  "uniform multi-token decode (q 2-6) with long context (spec-decode kernels)", level="standard"),
    AttentionCase("window_edges", (1, 4, 6), (30, 9, 6), "window of 1 (self only) on every kind of request",
                  sliding_window=1, level="standard"),
    AttentionCase("window_covers_all", (1, 6), (25, 12), "window wider than every sequence (no key masked)",
                  sliding_window=64, level="standard"),
    AttentionCase("gemma_scale_softcap", (1, 9), (60, 24), "scale != head_size^-1/2 with soft cap 50 (Gemma-2 27B)",
                  head_size=128, scale=144 ** -0.5, logits_soft_cap=50.0, num_heads=4, num_kv_heads=2,
                  level="standard"),
    AttentionCase("non_causal", (5, 3), (21, 3), "causal=False over the paged cache", causal=False, level="standard"),
    # non-causal requests with context under a window and ALiBi: the contract (vLLM 0.32's CPU kernel, measured in
    # tests/vllm_bridge/test_vllm_attention.py) places the queries after their context and makes the window two-sided
    AttentionCase("non_causal_window", (5, 9, 1), (21, 9, 40), "causal=False with a window over a context: queries at "
                  "c + t (not 0..q-1), a two-sided window |p - j| < w (not one-sided)", causal=False, sliding_window=4,
                  level="standard"),
    AttentionCase("non_causal_alibi", (5, 4), (21, 4), "causal=False with ALiBi over a context: keys after the query "
                  "biased by -slope * (p - j) (signed, not -slope * |p - j|)", causal=False, alibi=True, num_heads=4,
                  num_kv_heads=4, level="standard"),
    AttentionCase("encoder_only", (5, 12), (5, 12), "encoder-only (bidirectional within the batch, no cache), with "
                  "a window", attn_type=AttentionType.ENCODER_ONLY, sliding_window=4, level="standard"),
    AttentionCase("shared_prefix", (3, 2), (40, 37), "two requests sharing their first two blocks (prefix caching)",
                  shared_prefix_blocks=2, level="standard"),
    AttentionCase("fused_qkv_views", (1, 8), (24, 8), "q/k/v as strided views of one fused qkv tensor",
                  fused_qkv=True, level="standard"),
    # saturation through small scales: |x / scale| passes the format's largest value (448 e4m3, 57344 e5m2) for
    # |x| > 1.75, about 8% of the N(0, 1) keys and values; outputs stay O(1), judged by the usual tolerances
    AttentionCase("fp8_saturating", (1, 6), (33, 18), "fp8 values beyond the e4m3 range (saturation, not inf/NaN)",
                  kv_dtypes=("fp8_e4m3",), k_scale=2.0 ** -8, v_scale=2.0 ** -8, level="standard"),
    AttentionCase("fp8_saturating_e5m2", (1, 6), (33, 18), "fp8 values beyond the e5m2 range (saturation)",
                  kv_dtypes=("fp8_e5m2",), k_scale=2.0 ** -15, v_scale=2.0 ** -15, level="standard"),
    AttentionCase("alibi_odd_heads", (1, 5), (26, 14), "ALiBi slopes for 6 heads (non-power-of-2 extension)",
                  num_heads=6, num_kv_heads=6, alibi=True, level="standard"),
    # ----- full -----------------------------------------------------------------------------------
    AttentionCase("long_decode_sinks", (1, 1), (4100, 2050), "decode over a long context with sinks (split-KV "
                  "reductions)", num_heads=8, num_kv_heads=1, sinks=True, block_size=128, level="full"),
    AttentionCase("falcon_mqa", (1, 3), (20, 11), "71 heads over one kv head", num_heads=71, num_kv_heads=1,
                  level="full"),
    AttentionCase("head512", (1, 2), (17, 5), "head size 512", num_heads=2, num_kv_heads=1, head_size=512,
                  block_size=128, level="full"),
]

# ----- size cases: token, request and block counts just past common kernel limits (issue 33) --------------------
SIZE_FLAG = "past_limit"                  # in the names of the token and request cases (`-k past_limit`)
_SIZE_LAYOUT = {"num_heads": 1, "num_kv_heads": 1, "head_size": 32, "one_dtype": True}


def _size_cases() -> list[AttentionCase]:
    """The cases of reference_impl.attention.size_cases: forward only (cache_write also on the blocks case)."""
    cases = []
    for limit, level in size_cases.TOKEN_LIMITS:
        q, s = size_cases.mixed(limit + 1)
        cases.append(AttentionCase(
            f"tokens_{limit + 1}_{SIZE_FLAG}", q, s, f"{limit + 1} tokens in one prefill/mixed batch ({len(q)} "
            f"requests): a launch grid, an index or a buffer over tokens that stops at {limit}", level=level,
            memory_bytes=(limit + 1) * size_cases.BYTES_PER_TOKEN if level == "full" else None, **_SIZE_LAYOUT))
    for limit, level in size_cases.REQUEST_LIMITS:
        q, s = size_cases.decodes(limit + 1)
        cases.append(AttentionCase(
            f"seqs_{limit + 1}_{SIZE_FLAG}", q, s, f"a decode batch of {limit + 1} requests (a cache of {len(q) + 3} "
            f"blocks): "
            f"a grid over sequences or a per-batch buffer sized for {limit}", level=level,
            memory_bytes=(limit + 1) * size_cases.BYTES_PER_TOKEN if level == "full" else None, **_SIZE_LAYOUT))
    q, s = size_cases.high_blocks()
    cases.append(AttentionCase(
        f"blocks_past_{size_cases.BLOCK_LIMIT}", q, s, f"a cache of more than {size_cases.BLOCK_LIMIT} "
        f"blocks whose batch uses blocks {size_cases.BLOCK_LIMIT} and up (block-table entries past 2^16): a block "
        "index held in 16 bits, a grid over the cache's blocks", first_block=size_cases.BLOCK_LIMIT,
        level="standard", **_SIZE_LAYOUT))
    return cases


CASES += _size_cases()
CASES_BY_NAME = {c.name: c for c in CASES}


def cases_at(level: str) -> list[AttentionCase]:
    return [c for c in CASES if c.runs_at(level)]


def case_dtypes(case: AttentionCase, dtypes: list) -> list:
    """The dtypes among `dtypes` (those the backend declares) the case runs in: all, or for a `one_dtype` case the
    first of ONE_DTYPE_ORDER among them."""
    if not case.one_dtype:
        return list(dtypes)
    return next(([d] for d in ONE_DTYPE_ORDER if d in dtypes), list(dtypes[:1]))


def admits(backend, case: AttentionCase, dtype, kv_cache_dtype: str) -> list[str]:
    """Why `backend` does not declare `case` with these dtypes (validate_configuration's reasons); [] = declared."""
    return backend.validate_configuration(**case.selector_config(dtype, kv_cache_dtype)._replace(
        block_size=case.block_size)._asdict())


@dataclasses.dataclass(frozen=True)
class Probe:
    """A capability a backend declares (or not), and a small case that exercises exactly it."""

    feature: str                          # how messages name it
    case: AttentionCase
    declared: object                      # backend -> bool: whether the backend declares the capability
    declare: str = ""                     # where a backend declares it
    kv_cache_dtype: str = "auto"
    dtype: str | None = None              # the dtype the probe runs in (None: the backend's first)

    def applies(self, platform) -> bool:
        return self.dtype is None or getattr(torch, self.dtype) in platform.supported_dtypes


def _probe_case(name: str, **kw) -> AttentionCase:
    kw.setdefault("query_lens", (1, 6))
    kw.setdefault("seq_lens", (30, 14))
    return AttentionCase(f"probe_{name}", catches=f"the {name} capability", **kw)


PROBES: dict[str, Probe] = {
    "sinks": Probe("attention sinks", _probe_case("sinks", sinks=True), lambda b: b.supports_sink(), "supports_sink()"),
    "sliding_window": Probe("sliding window", _probe_case("sliding_window", sliding_window=7),
                            lambda b: b.supports_sliding_window(), "supports_sliding_window()"),
    "non_causal": Probe("non-causal attention (causal=False)", _probe_case("non_causal", causal=False),
                        lambda b: b.supports_non_causal(), "supports_non_causal()"),
    "encoder_only": Probe("attention type encoder_only", _probe_case(
        "encoder_only", query_lens=(6, 9), seq_lens=(6, 9), attn_type=AttentionType.ENCODER_ONLY),
        lambda b: b.supports_attn_type(AttentionType.ENCODER_ONLY), "supports_attn_type()"),
    "head_size_48": Probe("head size 48", _probe_case("head_size_48", head_size=48), lambda b: b.supports_head_size(48), "get_supported_head_sizes()"),
    "head_size_80": Probe("head size 80", _probe_case("head_size_80", head_size=80), lambda b: b.supports_head_size(80), "get_supported_head_sizes()"),
    "block_size_16": Probe("block size 16", _probe_case("block_size_16", block_size=16),
                           lambda b: b.supports_block_size(16), "get_supported_kernel_block_sizes()"),
    "block_size_32": Probe("block size 32", _probe_case("block_size_32", block_size=32),
                           lambda b: b.supports_block_size(32), "get_supported_kernel_block_sizes()"),
    "kv_fp8_e4m3": Probe("kv_cache_dtype fp8_e4m3", _probe_case("kv_fp8_e4m3"),
                         lambda b: b.supports_kv_cache_dtype("fp8_e4m3"), "supported_kv_cache_dtypes", kv_cache_dtype="fp8_e4m3"),
    "kv_fp8_e5m2": Probe("kv_cache_dtype fp8_e5m2", _probe_case("kv_fp8_e5m2"),
                         lambda b: b.supports_kv_cache_dtype("fp8_e5m2"), "supported_kv_cache_dtypes", kv_cache_dtype="fp8_e5m2"),
    **{f"dtype_{d}": Probe(f"dtype {d}", _probe_case(f"dtype_{d}"),
                           lambda b, d=d: b.supports_dtype(getattr(torch, d)), "supported_dtypes", dtype=d)
       for d in ("float32", "float16", "bfloat16")},
}


# ----- drawn cases: seeded random batches and feature mixes, within what a backend declares ----------------------
DRAWN = {"quick": 0, "standard": 3, "full": 12}      # how many drawn forward cases per dtype at each level
DRAWN_PREFIX = "drawn_"
_HEAD_SIZES = (64, 80, 96, 128)
_HEADS = ((4, 4), (8, 2), (14, 2), (9, 3), (6, 1), (8, 1))
_BLOCKS = (16, 32, 64)


def drawn_case(name: str, seed: int, backend) -> AttentionCase | None:
    """The case `drawn_<i>` for `seed`: 1-5 requests, each a decode, a multi-token decode, a chunked or fresh
    prefill or empty, over random head layouts, head and block sizes and features, drawn among what `backend`
    declares; None when it declares none of the head or block sizes drawn from."""
    import random

    index = int(name.removeprefix(DRAWN_PREFIX))
    rng = random.Random(seed * 7919 + index)
    head_sizes = [d for d in _HEAD_SIZES if backend.supports_head_size(d)]
    blocks = [b for b in _BLOCKS if backend.supports_block_size(b)]
    if not head_sizes or not blocks:
        return None
    query_lens, seq_lens = [], []
    for _ in range(rng.randint(1, 5)):
        kind = rng.choice(("decode", "multi", "chunked", "fresh", "empty"))
        context = rng.randint(1, 200)
        q = {"decode": 1, "multi": rng.randint(2, 6), "chunked": rng.randint(2, 24), "fresh": rng.randint(1, 40),
             "empty": 0}[kind]
        query_lens.append(q)
        seq_lens.append(q if kind == "fresh" else q + context)
    if sum(query_lens) == 0:
        query_lens[0] += 1
        seq_lens[0] += 1
    heads, kv_heads = rng.choice(_HEADS)
    features = {}
    if backend.supports_sliding_window() and rng.random() < 0.4:
        features["sliding_window"] = rng.choice((1, 7, 16, 33, 100, 300))
    if rng.random() < 0.3:
        features["logits_soft_cap"] = rng.choice((5.0, 30.0))
        features["scale"] = 0.3
    if rng.random() < 0.2:
        features["alibi"] = True
    if backend.supports_sink() and rng.random() < 0.3:
        features["sinks"] = True
    return AttentionCase(name, tuple(query_lens), tuple(seq_lens), f"a seeded random batch and feature mix (seed "
                         f"{seed})", num_heads=heads, num_kv_heads=kv_heads, head_size=rng.choice(head_sizes),
                         block_size=rng.choice(blocks), padding=rng.randint(0, 4), level="standard", **features)


def case_named(name: str, seed: int, backend) -> AttentionCase | None:
    """A declared case by name, or the drawn case `drawn_<i>` for `seed` and `backend`."""
    if name.startswith(DRAWN_PREFIX):
        return drawn_case(name, seed, backend)
    return CASES_BY_NAME[name]


def ordered_for(backend, case: AttentionCase) -> AttentionCase:
    """The case with its requests in the order a runner hands `backend`: decodes (query_len <= the builder's
    `reorder_batch_threshold`) first when the builder sets one (vLLM's split_decodes_and_prefills), as given
    otherwise. A case whose first two requests share prefix blocks keeps that pair first."""
    threshold = getattr(backend.get_builder_cls(), "reorder_batch_threshold", None)
    if threshold is None or case.shared_prefix_blocks:
        return case
    order = sorted(range(len(case.query_lens)), key=lambda i: case.query_lens[i] > threshold)
    return dataclasses.replace(case, query_lens=tuple(case.query_lens[i] for i in order),
                               seq_lens=tuple(case.seq_lens[i] for i in order))
