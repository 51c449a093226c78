"""Attention layers without a KV cache (docs/catalog.md `mm_encoder_attn`, `multi_head_latent_attention`).

Both compute `softmax(q k^T * scale) v` in float32 (float64 inputs: float64) and round the result
once to the input dtype, which is what flash-attention style kernels approximate (float32
accumulation, one rounding of the output).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from reference_impl.custom_op import CustomOp, PluggableLayer
from reference_impl.ir.cases import randn
from reference_impl.ir.tolerances import ATTN_TOLERANCES, MLA_TOLERANCES
from reference_impl.layers._composite import CompositeLayer, init_composite_params, linear, require_single_rank
from reference_impl.layers.cases import LayerCase, declare_cases
from reference_impl.layers.layernorm import RMSNorm
from reference_impl.layers.rotary_embedding import RotaryEmbedding


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """`softmax(q k^T * scale + mask) v` over `[..., heads, seq, dim]` in q's dtype (callers upcast).

    `mask` is boolean `[q_len, kv_len]` (True: attend); every query row must keep at least one key.
    """
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def _segment_mask(cu_seqlens: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Block-diagonal `[seq, seq]` mask: positions attend within their cu_seqlens segment only."""
    positions = torch.arange(seq_len, device=cu_seqlens.device)
    segment = torch.searchsorted(cu_seqlens[1:].to(torch.int64), positions, right=True)
    return segment[:, None] == segment[None, :]


@CustomOp.register("mm_encoder_attn")
class MMEncoderAttention(CustomOp):
    """Multi-headed attention without any cache, used for multimodal encoders (non-causal).

    `forward(query, key, value, cu_seqlens=None, max_seqlen=None)`: query `[batch, seq, num_heads *
    head_size]` or `[batch, seq, num_heads, head_size]`, key/value likewise with num_kv_heads (GQA:
    query head h reads kv head `h // (num_heads // num_kv_heads)`); the output has the query's layout.
    `cu_seqlens` (int, `[n + 1]`, 0 ... seq, non-decreasing) splits the sequence dim into `n`
    packed sequences that attend only within themselves (every batch row alike); query and key
    lengths must then agree. `max_seqlen` is a flash-attention hint and is ignored.

    vLLM always enables this op (its `enabled()` is True); here custom_ops governs it like every
    CustomOp (the conformance dispatch check relies on that), and vision encoders that want the
    platform kernel whatever custom_ops says pass `enforce_enable=True`, as for ApplyRotaryEmb.
    """

    def __init__(self, num_heads: int, head_size: int, scale: float | None = None, num_kv_heads: int | None = None,
                 prefix: str = "", multimodal_config=None, *, enforce_enable: bool = False) -> None:
        super().__init__(enforce_enable=enforce_enable)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        for what, value in (("num_heads", num_heads), ("head_size", head_size), ("num_kv_heads", num_kv_heads)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"MMEncoderAttention: {what}={value!r} must be a positive int")
        if num_heads % num_kv_heads:
            raise ValueError(f"MMEncoderAttention: num_heads={num_heads} is not divisible by "
                             f"num_kv_heads={num_kv_heads}")
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self.num_queries_per_kv = num_heads // num_kv_heads
        self.scale = head_size ** -0.5 if scale is None else float(scale)
        self.layer_name = prefix
        self.multimodal_config = multimodal_config

    def _to_4d(self, t: torch.Tensor, heads: int, what: str) -> torch.Tensor:
        if t.dim() == 3 and t.shape[-1] == heads * self.head_size:
            return t.unflatten(-1, (heads, self.head_size))
        if t.dim() == 4 and t.shape[-2:] == (heads, self.head_size):
            return t
        raise ValueError(f"MMEncoderAttention: {what} must be [batch, seq, {heads} * {self.head_size}] or "
                         f"[batch, seq, {heads}, {self.head_size}], got {tuple(t.shape)}")

    def _check_cu_seqlens(self, cu_seqlens: torch.Tensor, q_len: int, kv_len: int) -> None:
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.is_floating_point():
            raise ValueError(f"MMEncoderAttention: cu_seqlens must be a 1-D int tensor [n + 1], got "
                             f"{cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
        if q_len != kv_len:
            raise ValueError(f"MMEncoderAttention: with cu_seqlens the query ({q_len}) and key ({kv_len}) "
                             f"sequence lengths must agree")
        if torch.compiler.is_compiling():
            return
        values = cu_seqlens.tolist()
        if values[0] != 0 or values[-1] != q_len or any(b < a for a, b in zip(values, values[1:])):
            raise ValueError(f"MMEncoderAttention: cu_seqlens={values} must start at 0, not decrease and end at "
                             f"the sequence length {q_len}")

    def forward_native(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       cu_seqlens: torch.Tensor | None = None, max_seqlen: torch.Tensor | None = None) -> torch.Tensor:
        q = self._to_4d(query, self.num_heads, "query")
        k = self._to_4d(key, self.num_kv_heads, "key")
        v = self._to_4d(value, self.num_kv_heads, "value")
        if k.shape[:2] != v.shape[:2] or k.shape[0] != q.shape[0]:
            raise ValueError(f"MMEncoderAttention: batch/sequence dims differ: query {tuple(query.shape)}, "
                             f"key {tuple(key.shape)}, value {tuple(value.shape)}")
        mask = None
        if cu_seqlens is not None:
            self._check_cu_seqlens(cu_seqlens, q.shape[1], k.shape[1])
            mask = _segment_mask(cu_seqlens, q.shape[1])
        compute = _compute_dtype(query)
        # [batch, heads, seq, dim]; kv heads repeated for grouped queries.
        q, k, v = (t.to(compute).transpose(1, 2) for t in (q, k, v))
        if self.num_queries_per_kv > 1:
            k = k.repeat_interleave(self.num_queries_per_kv, dim=1)
            v = v.repeat_interleave(self.num_queries_per_kv, dim=1)
        out = attention_core(q, k, v, self.scale, mask).transpose(1, 2).to(query.dtype)
        return out.flatten(-2) if query.dim() == 3 else out

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, head_size={self.head_size}, num_kv_heads={self.num_kv_heads}, "
                f"scale={self.scale}")


@PluggableLayer.register("multi_head_latent_attention")
class MultiHeadLatentAttentionWrapper(CompositeLayer):
    """Multi-head latent attention (DeepSeek-V2/V3), prefill of one sequence, no KV cache.

    `forward(positions [T], hidden_states [T, hidden_size]) -> [T, hidden_size]`:
    1. with `q_lora_rank`: `fused_qkv_a_proj` gives `[q_c | kv_c | k_pe]`, `q = q_b_proj(q_a_layernorm(q_c))`;
       without: `q = q_proj(h)`, `[kv_c | k_pe] = kv_a_proj_with_mqa(h)`.
    2. `kv_c = kv_a_layernorm(kv_c)`; `kv_b_proj(kv_c)` gives per head `[k_nope | v]`.
    3. q is `[T, heads, qk_nope_head_dim + qk_rope_head_dim]`; `rotary_emb` rotates its rope part and
       the single shared `k_pe` head (gptj style unless `is_neox_style`); k = `[k_nope | k_pe]`.
    4. causal attention with `scale` (default `qk_head_dim ** -0.5`), then `o_proj`.

    Our compact form of vLLM's wrapper: it owns its projections (bias-free linears, `params_dtype`),
    norms and rotary embedding instead of taking `mla_modules`; the decode path (absorbed weights,
    latent KV cache), the sparse indexer and llama-4 scaling are left out; `tp_size` must be 1.
    A PluggableLayer, as in vLLM 0.32 (replaced whole; `forward` runs the sub-layers dispatched).
    """

    def __init__(self, hidden_size: int, num_heads: int, scale: float | None, qk_nope_head_dim: int,
                 qk_rope_head_dim: int, v_head_dim: int, q_lora_rank: int | None, kv_lora_rank: int, *,
                 max_position_embeddings: int = 4096, rope_theta: float = 10000.0, is_neox_style: bool = False,
                 rms_norm_eps: float = 1e-6, params_dtype: torch.dtype | None = None, tp_size: int = 1,
                 prefix: str = "") -> None:
        super().__init__()
        name = type(self).__name__
        require_single_rank(name, "tp_size", tp_size)
        sizes = {"hidden_size": hidden_size, "num_heads": num_heads, "qk_nope_head_dim": qk_nope_head_dim,
                 "qk_rope_head_dim": qk_rope_head_dim, "v_head_dim": v_head_dim, "kv_lora_rank": kv_lora_rank}
        if q_lora_rank is not None:
            sizes["q_lora_rank"] = q_lora_rank
        for what, value in sizes.items():
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: {what}={value!r} must be a positive int")
        if qk_rope_head_dim % 2:
            raise ValueError(f"{name}: qk_rope_head_dim={qk_rope_head_dim} must be even (rotary pairs)")
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.q_lora_rank = q_lora_rank
        self.kv_lora_rank = kv_lora_rank
        self.scale = self.qk_head_dim ** -0.5 if scale is None else float(scale)
        self.prefix = prefix
        dtype = params_dtype or torch.get_default_dtype()

        def proj(n_in, n_out):
            return nn.Linear(n_in, n_out, bias=False, dtype=dtype).requires_grad_(False)

        if q_lora_rank is not None:
            self.fused_qkv_a_proj = proj(hidden_size, q_lora_rank + kv_lora_rank + qk_rope_head_dim)
            self.q_a_layernorm = RMSNorm(q_lora_rank, eps=rms_norm_eps, dtype=dtype)
            self.q_b_proj = proj(q_lora_rank, num_heads * self.qk_head_dim)
        else:
            self.q_proj = proj(hidden_size, num_heads * self.qk_head_dim)
            self.kv_a_proj_with_mqa = proj(hidden_size, kv_lora_rank + qk_rope_head_dim)
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, eps=rms_norm_eps, dtype=dtype)
        self.kv_b_proj = proj(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim))
        self.rotary_emb = RotaryEmbedding(qk_rope_head_dim, qk_rope_head_dim, max_position_embeddings, rope_theta,
                                          is_neox_style, dtype)
        self.o_proj = proj(num_heads * v_head_dim, hidden_size)

    def _forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, *, native: bool) -> torch.Tensor:
        if hidden_states.dim() != 2 or hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(f"{type(self).__name__} expects hidden_states [tokens, {self.hidden_size}], got "
                             f"{tuple(hidden_states.shape)}")
        tokens = hidden_states.shape[0]
        if positions.shape != (tokens,):
            raise ValueError(f"{type(self).__name__}: positions must be [{tokens}], got {tuple(positions.shape)}")
        rank, rope = self.kv_lora_rank, self.qk_rope_head_dim
        if self.q_lora_rank is not None:
            q_c, kv_lora = linear(hidden_states, self.fused_qkv_a_proj).split([self.q_lora_rank, rank + rope], -1)
            q = linear(self._call(self.q_a_layernorm, native, q_c.contiguous()), self.q_b_proj)
        else:
            kv_lora = linear(hidden_states, self.kv_a_proj_with_mqa)
            q = linear(hidden_states, self.q_proj)
        kv_c, k_pe = kv_lora.split([rank, rope], -1)
        kv = linear(self._call(self.kv_a_layernorm, native, kv_c.contiguous()), self.kv_b_proj)
        k_nope, v = kv.view(tokens, self.num_heads, -1).split([self.qk_nope_head_dim, self.v_head_dim], -1)
        q = q.view(tokens, self.num_heads, self.qk_head_dim)
        q_nope, q_pe = q.split([self.qk_nope_head_dim, rope], -1)
        q_pe, k_pe = self._call(self.rotary_emb, native, positions, q_pe.contiguous(),
                                k_pe.contiguous().view(tokens, 1, rope))
        q = torch.cat((q_nope, q_pe.view(tokens, self.num_heads, rope)), -1)
        k = torch.cat((k_nope, k_pe.view(tokens, 1, rope).expand(tokens, self.num_heads, rope)), -1)

        compute = _compute_dtype(hidden_states)
        causal = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).tril()
        out = attention_core(*(t.to(compute).transpose(0, 1) for t in (q, k, v)), self.scale, causal)
        out = out.transpose(0, 1).reshape(tokens, self.num_heads * self.v_head_dim).to(hidden_states.dtype)
        return linear(out, self.o_proj)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, qk_nope_head_dim={self.qk_nope_head_dim}, "
                f"qk_rope_head_dim={self.qk_rope_head_dim}, v_head_dim={self.v_head_dim}, "
                f"q_lora_rank={self.q_lora_rank}, kv_lora_rank={self.kv_lora_rank}, scale={self.scale}")


# ----- conformance cases --------------------------------------------------------------------------
def _mm_case(name, batch, seq, heads, kv_heads, head_size, *, kv_seq=None, layout="3d", cu_seqlens=None,
             scale=None, level="quick"):
    def make_inputs(dtype, device, gen):
        kvs = kv_seq or seq
        shapes = ((batch, seq, heads, head_size), (batch, kvs, kv_heads, head_size),
                  (batch, kvs, kv_heads, head_size))
        q, k, v = (randn(s, dtype, device, gen) for s in shapes)
        if layout == "3d":
            q, k, v = (t.flatten(-2) for t in (q, k, v))
        if cu_seqlens is None:
            return (q, k, v)
        cu = torch.tensor(cu_seqlens, dtype=torch.int32, device=device)
        return (q, k, v, cu, torch.tensor(max(b - a for a, b in zip(cu_seqlens, cu_seqlens[1:]))))

    kwargs = {"num_heads": heads, "head_size": head_size, "num_kv_heads": kv_heads, "scale": scale}
    return LayerCase(name, lambda dtype: dict(kwargs), make_inputs, level=level)


declare_cases(MMEncoderAttention, tolerances=ATTN_TOLERANCES, cases=[
    _mm_case("batch=2,seq=9,heads=4,head=32", 2, 9, 4, 4, 32),
    _mm_case("batch=1,seq=7,heads=4/2,head=64,4d", 1, 7, 4, 2, 64, layout="4d"),
    _mm_case("batch=1,seq=12,heads=2/1,head=16,varlen=[0,5,6,12]", 1, 12, 2, 1, 16, cu_seqlens=[0, 5, 6, 12]),
    _mm_case("batch=2,seq=6,kv_seq=10,heads=3,head=8,scale=0.5", 2, 6, 3, 3, 8, kv_seq=10, scale=0.5),
    _mm_case("batch=1,seq=1,heads=1,head=8", 1, 1, 1, 1, 8),
    _mm_case("batch=1,seq=256,heads=16,head=80,varlen", 1, 256, 16, 16, 80, cu_seqlens=[0, 64, 100, 256],
             level="standard"),
])


def _mla_case(name, tokens, *, q_lora_rank, neox=False, scale=None, level="quick", **sizes):
    dims = {"hidden_size": 64, "num_heads": 4, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
            "kv_lora_rank": 24, **sizes}

    def make_kwargs(dtype):
        return {**dims, "scale": scale, "q_lora_rank": q_lora_rank, "is_neox_style": neox, "params_dtype": dtype,
                "max_position_embeddings": 512}

    def make_inputs(dtype, device, gen):
        positions = torch.randint(0, 512, (tokens,), generator=gen).to(device)
        return (positions, randn((tokens, dims["hidden_size"]), dtype, device, gen))

    return LayerCase(name, make_kwargs, make_inputs, init_params=init_composite_params, level=level)


declare_cases(MultiHeadLatentAttentionWrapper, tolerances=MLA_TOLERANCES, cases=[
    _mla_case("tokens=7,q_lora=32", 7, q_lora_rank=32),
    _mla_case("tokens=5,no_q_lora,neox,scale=0.2", 5, q_lora_rank=None, neox=True, scale=0.2),
    _mla_case("tokens=1,q_lora=16", 1, q_lora_rank=16),
    _mla_case("tokens=33,deepseek-like", 33, q_lora_rank=96, hidden_size=256, num_heads=8, qk_nope_head_dim=32,
              qk_rope_head_dim=16, v_head_dim=32, kv_lora_rank=64, level="standard"),
])
