"""The reference paged attention backend: pure torch, float32 compute, one rounding of the output.

Cache layout (the contract's, docs/attention.md): one tensor per layer `[num_blocks, num_kv_heads,
block_size, 2 * head_size]`, keys in `[..., :head_size]`, values in `[..., head_size:]`, in the model
dtype ("auto") or fp8 bits in uint8. `do_kv_cache_update` writes slots >= 0 only; `forward` reads each
request's `seq_lens[i]` keys through its block-table row and never writes the cache. ENCODER_ONLY and
ENCODER layers attend to the batch's own keys (no cache), bidirectionally.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from reference_impl.attention import kv_quant
from reference_impl.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)

ENCODER_TYPES = (AttentionType.ENCODER, AttentionType.ENCODER_ONLY)


@dataclasses.dataclass
class ReferenceAttentionMetadata:
    """The builder's output: the common metadata's tensors, with the per-request lengths on the CPU as lists."""

    num_actual_tokens: int
    query_start_loc: list[int]
    seq_lens: list[int]
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    causal: bool
    max_query_len: int
    max_seq_len: int


class ReferenceAttentionMetadataBuilder(AttentionMetadataBuilder):
    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> ReferenceAttentionMetadata:
        m = common_attn_metadata
        if isinstance(m.causal, torch.Tensor):
            raise NotImplementedError("the reference attention backend takes causal as a bool, not a per-token tensor")
        n = m.num_reqs
        qsl = m.query_start_loc_cpu[: n + 1].tolist()
        return ReferenceAttentionMetadata(num_actual_tokens=m.num_actual_tokens, query_start_loc=qsl,
                                          seq_lens=m.seq_lens[:n].cpu().tolist(), block_table=m.block_table_tensor,
                                          slot_mapping=m.slot_mapping, causal=bool(m.causal),
                                          max_query_len=m.max_query_len, max_seq_len=m.max_seq_len)


class ReferenceAttentionImpl(AttentionImpl):
    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None, sliding_window=None,
                 kv_cache_dtype="auto", logits_soft_cap=None, attn_type=AttentionType.DECODER,
                 kv_sharing_target_layer_name=None, sinks=None, **extra):
        if extra:
            raise NotImplementedError(f"the reference attention backend takes no {', '.join(sorted(extra))}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        if attn_type == AttentionType.ENCODER_DECODER:
            raise NotImplementedError("the reference attention backend has no cross-attention (encoder_decoder)")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window={sliding_window} must be >= 1 (None: no window)")
        if sinks is not None and tuple(sinks.shape) != (num_heads,):
            raise ValueError(f"sinks has shape {tuple(sinks.shape)}, expected ({num_heads},)")
        if alibi_slopes is not None and len(alibi_slopes) != num_heads:
            raise ValueError(f"alibi_slopes has {len(alibi_slopes)} values, expected {num_heads}")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads
        self.alibi_slopes = None if alibi_slopes is None else torch.tensor(alibi_slopes, dtype=torch.float32)
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.fp8 = kv_quant.fp8_dtype(kv_cache_dtype)
        self.logits_soft_cap = logits_soft_cap or None
        self.attn_type = AttentionType(attn_type)
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.sinks = sinks

    # ----- the cache -----------------------------------------------------------------------------
    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        if self.attn_type in ENCODER_TYPES:
            return
        slots = slot_mapping[: key.shape[0]].to(torch.long)
        rows = (slots >= 0).nonzero().flatten()
        if rows.numel() == 0:
            return
        slots = slots[rows]
        block_size = kv_cache.shape[2]
        blocks, offsets = slots // block_size, slots % block_size
        kv = torch.cat([self._stored(key[rows], layer._k_scale_float, kv_cache.dtype),
                        self._stored(value[rows], layer._v_scale_float, kv_cache.dtype)], dim=-1)
        kv_cache[blocks, :, offsets] = kv

    def _stored(self, x: torch.Tensor, scale: float, cache_dtype: torch.dtype) -> torch.Tensor:
        if self.fp8 is None:
            return x.to(cache_dtype)
        return kv_quant.quantize(x.to(torch.float32) / scale, self.fp8)

    def _read(self, kv: torch.Tensor, scale: float) -> torch.Tensor:
        if self.fp8 is None:
            return kv.to(torch.float32)
        return kv_quant.dequantize(kv, self.fp8) * scale

    # ----- attention ---------------------------------------------------------------------------------
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("the reference attention backend has no fused output quantization")
        if attn_metadata is None:
            return output
        m = attn_metadata
        d = self.head_size
        encoder = self.attn_type in ENCODER_TYPES
        qsl = m.query_start_loc
        # requests of one (query_len, seq_len) share their mask: computed as one batch (many short requests)
        groups: dict[tuple[int, int], list[int]] = {}
        for i, (start, end) in enumerate(zip(qsl[:-1], qsl[1:])):
            if end > start:
                groups.setdefault((end - start, m.seq_lens[i]), []).append(i)
        for (ql, seq_len), members in groups.items():
            rows = (torch.tensor([qsl[i] for i in members], device=query.device).view(-1, 1)
                    + torch.arange(ql, device=query.device)).flatten()
            if encoder:
                k = key[rows].view(len(members), ql, *key.shape[1:]).to(torch.float32)
                v = value[rows].view(len(members), ql, *value.shape[1:]).to(torch.float32)
                causal = False
            else:
                k, v = self._gather_group(kv_cache, m.block_table[members], seq_len, d, layer)
                causal = m.causal
            q = query[rows].view(len(members), ql, *query.shape[1:]).to(torch.float32)
            output[rows] = self._attend_group(q, k, v, seq_len, causal, encoder).flatten(0, 1).to(output.dtype)
        return output

    def _gather(self, kv_cache, block_row, seq_len, d, layer):
        """Keys and values `[seq_len, num_kv_heads, head_size]` (float32) of one request, through its blocks."""
        k, v = self._gather_group(kv_cache, block_row.view(1, -1), seq_len, d, layer)
        return k[0], v[0]

    def _gather_group(self, kv_cache, block_rows, seq_len, d, layer):
        """Keys and values `[G, seq_len, num_kv_heads, head_size]` (float32) of G requests of one seq_len, through
        their block-table rows `[G, width]`."""
        block_size = kv_cache.shape[2]
        needed = math.ceil(seq_len / block_size)
        if needed > block_rows.shape[1]:
            raise ValueError(f"a request of seq_len {seq_len} needs {needed} blocks of {block_size}; its block-table "
                             f"row has {block_rows.shape[1]}")
        blocks = block_rows[:, :needed].to(torch.long)
        g = blocks.shape[0]
        kv = kv_cache[blocks].transpose(2, 3).reshape(g, -1, self.num_kv_heads, 2 * d)[:, :seq_len]
        return self._read(kv[..., :d], layer._k_scale_float), self._read(kv[..., d:], layer._v_scale_float)

    def _per_query_head(self, x: torch.Tensor) -> torch.Tensor:
        """`[n, KVH, D]` -> `[n, H, D]`: query head h reads kv head h // (H / KVH) (GQA, as repeat_interleave)."""
        return x.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)

    def _attend(self, q, k, v, seq_len, causal, encoder):
        """Softmax attention of one request's queries `[ql, H, D]` over its keys `[seq_len, KVH, D]`, float32."""
        return self._attend_group(q[None], k[None], v[None], seq_len, causal, encoder)[0]

    def _query_positions(self, query_len: int, seq_len: int, causal: bool, device) -> torch.Tensor:
        """The new tokens' positions among the request's keys: after the context, `c + t`, causal or not."""
        return torch.arange(seq_len - query_len, seq_len, device=device)

    def _alibi_distance(self, p: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """The ALiBi distance `p - j` (signed: a key after a non-causal query gets a positive bias)."""
        return p - j

    def _attend_group(self, q, k, v, seq_len, causal, encoder):
        """`_attend` for G requests of one (query_len, seq_len): q `[G, ql, H, D]`, k and v `[G, seq_len, KVH, D]`."""
        g, ql = q.shape[0], q.shape[1]
        k = self._per_query_head(k.flatten(0, 1)).view(g, seq_len, self.num_heads, -1)
        v = self._per_query_head(v.flatten(0, 1)).view(g, seq_len, self.num_heads, -1)
        s = torch.einsum("gqhd,gkhd->ghqk", q, k) * self.scale
        if self.logits_soft_cap is not None:
            s = self.logits_soft_cap * torch.tanh(s / self.logits_soft_cap)
        p = self._query_positions(ql, seq_len, causal, q.device).view(ql, 1)
        j = torch.arange(seq_len, device=q.device).view(1, seq_len)
        if self.alibi_slopes is not None:
            s = s - self.alibi_slopes.view(-1, 1, 1) * self._alibi_distance(p, j).to(torch.float32)
        allowed = torch.ones(ql, seq_len, dtype=torch.bool, device=q.device)
        if causal:
            allowed &= j <= p
        if self.sliding_window is not None:
            w = self.sliding_window
            allowed &= ((p - j).abs() < w) if (encoder or not causal) else (j > p - w)
        s = s.masked_fill(~allowed, float("-inf"))
        if self.sinks is not None:
            sink = self.sinks.to(torch.float32).view(1, -1, 1, 1).expand(g, -1, ql, 1)
            s = torch.cat([s, sink], dim=-1)
        probs = torch.softmax(s, dim=-1)[..., :seq_len]
        return torch.einsum("ghqk,gkhd->gqhd", probs, v)


class ReferenceAttentionBackend(AttentionBackend):
    """Every feature of the oracle, any block and head size, fp32/fp16/bf16, auto and fp8 KV caches."""

    supported_dtypes = [torch.float32, torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes = ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]
    forward_includes_kv_cache_update = False

    @staticmethod
    def get_name() -> str:
        return "REFERENCE"

    @staticmethod
    def get_impl_cls():
        return ReferenceAttentionImpl

    @staticmethod
    def get_builder_cls():
        return ReferenceAttentionMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return [MultipleOf(1)]

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_non_causal(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type in (AttentionType.DECODER, AttentionType.ENCODER, AttentionType.ENCODER_ONLY)
