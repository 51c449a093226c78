"""A small Llama-shaped decoder (or Mixtral-shaped with `num_experts`) built from the reference layers.

Embedding (VocabParallelEmbedding) -> N x [RMSNorm, attention (QKV column-parallel projection,
rotary, causal attention, row-parallel output projection), RMSNorm, MLP (merged gate/up
column-parallel projection, SiluAndMul or GeluAndMul, row-parallel down projection) or a sparse MoE
block (a replicated router and FusedMoE over this rank's slice of every expert, or with expert parallelism over this
rank's experts whole, all-reduced)] ->
RMSNorm -> ParallelLMHead + LogitsProcessor. The residual stream goes through `RMSNorm(x, residual)`
(IR `fused_add_rms_norm.maybe_inplace`). Its shape is a DecoderConfig (models/decoder_config.py), which
also covers the Llama-shaped families' variants (rope scaling, projection biases, a sliding attention
window, a gelu-gated MLP) and two families whose layers differ: Gemma-2 (Gemma2DecoderLayer: four Gemma
RMSNorms per layer, a scaled embedding, soft-capped attention scores and logits) and gpt-oss (GptOssMoE:
a biased router and clamped-SwiGLU experts; attention sinks).

`forward(input_ids, positions)` is one sequence recomputed whole (causal SDPA, no cache).
`forward(input_ids, positions, cu_seqlens, seq_lens)` runs packed tokens of several sequences
against the current paged KV cache (`kv_cache.using_kv_cache`): prompts, chunks of prompts after their
context, decode steps, or a mix. That attention runs on the attention backend the current platform selects
(or `attn_backend`), through `Attention` layers (models/paged_attention.py).
`logits_indices` keeps the LM head to the rows that are sampled (each sequence's last token).
Weights come from a full (unsharded) checkpoint dict with Hugging Face names (Llama, Mixtral, Gemma-2, gpt-oss)
(models/weights.py: `random_checkpoint` makes a seeded one): `load_weights` checks every tensor's shape
(`expected_shapes`) and shards it onto this rank through the layers' weight loaders; `build_model`
builds a decoder and loads one.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference_impl.attention.layer import Attention
from reference_impl.attention.registry import resolve
from reference_impl.distributed import (
    divide,
    get_ep_group,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from reference_impl.distributed import tensor_model_parallel_all_reduce
from reference_impl.layers.fused_moe import FusedMoE
from reference_impl.layers.layernorm import GemmaRMSNorm, RMSNorm
from reference_impl.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from reference_impl.layers.logits_processor import LogitsProcessor
from reference_impl.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from reference_impl.models.decoder_config import GATED_ACTIVATIONS, DecoderConfig
from reference_impl.models.kv_cache import KVCache, current_kv_cache
from reference_impl.models.paged_attention import DecoderAttention, DecoderStep
from reference_impl.models.rope import build_rotary
from reference_impl.models.weights import expected_shapes, random_checkpoint


class LlamaAttention(nn.Module):
    """Causal self-attention; this rank's heads, output projection all-reduced. Against the KV cache through
    `self.attn` (the platform's attention backend, given the soft cap, sinks and window); one sequence without
    a cache through SDPA, or the softmax written out when a soft cap or sinks are in it (`_explicit_attention`)."""

    def __init__(self, config: DecoderConfig, dtype: torch.dtype, prefix: str = "", layer_index: int = 0,
                 attn_backend: type | str | None = None):
        super().__init__()
        self.layer_index = layer_index
        self.head_dim = config.head_dim
        self.window = config.attention_window(layer_index)
        self.qkv_proj = QKVParallelLinear(config.hidden_size, config.head_dim, config.num_heads, config.num_kv_heads,
                                          bias=config.qkv_bias, params_dtype=dtype, prefix=f"{prefix}.qkv_proj")
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(config.num_heads * config.head_dim, config.hidden_size,
                                        bias=config.o_proj_bias, params_dtype=dtype, prefix=f"{prefix}.o_proj")
        self.rotary_emb = build_rotary(config.head_dim, config.max_position_embeddings, config.rope_theta,
                                       config.rope_scaling, dtype)
        self.scale = config.attention_scale
        self.soft_cap = config.attn_logit_softcap
        # this rank's heads' sink logits (gpt-oss), float32 as vLLM keeps them; the backend's impl is handed
        # this very tensor, so the checkpoint's values (copied in place by load_weights) reach it
        self.sinks = None
        if config.attention_sinks:
            self.sinks = nn.Parameter(torch.zeros(self.num_heads, dtype=torch.float32), requires_grad=False)
        if isinstance(attn_backend, str):
            attn_backend = resolve(attn_backend)
        self.attn = Attention(self.num_heads, self.head_dim, self.scale, self.num_kv_heads,
                              logits_soft_cap=self.soft_cap, per_layer_sliding_window=self.window,
                              prefix=f"{prefix}.attn", sinks=self.sinks, attn_backend=attn_backend, dtype=dtype)
        self.decoder_key = ""   # the DecoderAttention holding self.attn (set by LlamaModel)

    def load_sinks(self, tensor: torch.Tensor) -> None:
        """Copy this rank's heads' slice of the full `[num_heads]` sinks in place (the backend holds the tensor)."""
        start = get_tensor_model_parallel_rank() * self.num_heads
        with torch.no_grad():
            self.sinks.copy_(tensor[start:start + self.num_heads])

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                batch: DecoderStep | tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        if batch is not None:   # packed sequences against the current KV cache, through the attention backend
            if isinstance(batch, DecoderStep):    # eager: planned once for all layers
                attn = batch.attend(self.layer_index, q, k, v)
            else:                                 # compiled: one opaque op per layer
                attn = torch.ops.reference_model.paged_attention(q, k, v, positions, *batch, self.decoder_key,
                                                                 self.layer_index)
            out, _ = self.o_proj(attn)
            return out
        n = hidden_states.shape[0]
        q = q.reshape(n, self.num_heads, self.head_dim).transpose(0, 1).unsqueeze(0)
        k = k.reshape(n, self.num_kv_heads, self.head_dim).transpose(0, 1).unsqueeze(0)
        v = v.reshape(n, self.num_kv_heads, self.head_dim).transpose(0, 1).unsqueeze(0)
        mask = None
        if self.window is not None:   # causal and within the window: 0 <= i - j < window
            distance = positions[:, None] - positions[None, :]
            mask = ((distance >= 0) & (distance < self.window))[None, None]
        if self.soft_cap is None and self.sinks is None:
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scale,
                                                  enable_gqa=self.num_heads != self.num_kv_heads)
        else:
            if mask is None:
                mask = (positions[:, None] >= positions[None, :])[None, None]
            attn = self._explicit_attention(q, k, v, mask)
        attn = attn.squeeze(0).transpose(0, 1).reshape(n, self.q_size)
        out, _ = self.o_proj(attn)
        return out

    def _explicit_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            allowed: torch.Tensor) -> torch.Tensor:
        """Softmax attention written out, for what SDPA cannot say: scores soft-capped (`c * tanh(s / c)`) before
        the mask, and a per-head sink logit in the denominator. Float32 (float64 for float64) throughout, one
        rounding at the end, as the paged backends compute. q `[1, H, n, D]`, k and v `[1, KVH, n, D]`."""
        compute = torch.promote_types(q.dtype, torch.float32)
        group = self.num_heads // self.num_kv_heads
        k = k.to(compute).repeat_interleave(group, dim=1)
        v = v.to(compute).repeat_interleave(group, dim=1)
        scores = torch.matmul(q.to(compute), k.transpose(-1, -2)) * self.scale
        if self.soft_cap is not None:
            scores = self.soft_cap * torch.tanh(scores / self.soft_cap)
        scores = scores.masked_fill(~allowed, float("-inf"))
        if self.sinks is not None:
            sinks = self.sinks.to(compute).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
            probs = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, v).to(q.dtype)


class LlamaMLP(nn.Module):
    def __init__(self, config: DecoderConfig, dtype: torch.dtype, prefix: str = ""):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [config.intermediate_size] * 2,
                                                       bias=config.mlp_bias, params_dtype=dtype,
                                                       prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias,
                                           params_dtype=dtype, prefix=f"{prefix}.down_proj")
        self.act_fn = GATED_ACTIVATIONS[config.hidden_act]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        out, _ = self.down_proj(self.act_fn(gate_up))
        return out


_MOE_BLOCKS: dict[str, SparseMoE] = {}


@torch.library.custom_op("reference_model::moe_experts", mutates_args=())
def _moe_experts(x: torch.Tensor, router_logits: torch.Tensor, block: str) -> torch.Tensor:
    """A MoE block's FusedMoE as one opaque op for torch.compile: the reference experts loop over the
    experts actually routed to (data-dependent), which a graph cannot trace."""
    return _MOE_BLOCKS[block].experts(x, router_logits)


@_moe_experts.register_fake
def _(x, router_logits, block):
    return x.new_empty(x.shape)


class SparseMoE(nn.Module):
    """Sparse MoE block: a replicated router, FusedMoE over this rank's `intermediate / tp` slice of every
    expert, partial sums all-reduced over the ranks. With expert parallelism (`get_ep_group()` of more than one rank,
    as vLLM's enable_expert_parallel) FusedMoE holds this rank's experts whole instead (vLLM's MoE tensor-parallel
    size is then 1) and the same one all-reduce, over the same ranks, combines the experts' parts, as vLLM's MoE
    runner does with data parallelism 1. Compiled, the experts run as the opaque `reference_model::moe_experts` op.
    Subclasses name the router and choose the routing and activation."""

    def __init__(self, config: DecoderConfig, dtype: torch.dtype, prefix: str, router: str, router_bias: bool,
                 **experts: Any):
        """`router`: the router's attribute (and checkpoint) name; `experts`: FusedMoE's routing and activation."""
        super().__init__()
        self.router_name = router
        setattr(self, router, ReplicatedLinear(config.hidden_size, config.num_experts, bias=router_bias,
                                               params_dtype=dtype, prefix=f"{prefix}.{router}", return_bias=False))
        ep_size = get_ep_group().world_size
        # (ranks, rank) the experts' intermediate size is split over: none under expert parallelism
        self.shard = ((1, 0) if ep_size > 1 else
                      (get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()))
        self.intermediate_per_rank = divide(config.intermediate_size, self.shard[0], "intermediate_size")
        self.experts = FusedMoE(config.num_experts, config.num_experts_per_tok, config.hidden_size,
                                self.intermediate_per_rank, params_dtype=dtype, prefix=f"{prefix}.experts",
                                ep_size=ep_size, **experts)
        self.key = f"{prefix}#{len(_MOE_BLOCKS)}"
        _MOE_BLOCKS[self.key] = self

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.router_name)(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router_logits(x)
        if torch.compiler.is_compiling():
            out = torch.ops.reference_model.moe_experts(x, logits, self.key)
        else:
            out = self.experts(x, logits)
        return tensor_model_parallel_all_reduce(out)


class MixtralMoE(SparseMoE):
    """Mixtral's block (`block_sparse_moe`): a router without bias, softmax over all experts, top-k
    renormalized, SiLU-gated experts `w1` (gate), `w3` (up), `w2` (down) without biases."""

    def __init__(self, config: DecoderConfig, dtype: torch.dtype, prefix: str = ""):
        super().__init__(config, dtype, prefix, "gate", False, renormalize=True)

    def load_expert(self, expert: int, which: str, tensor: torch.Tensor) -> None:
        """Copy this rank's slice of expert `expert`'s `w1` (gate), `w3` (up) or `w2` (down) weight; nothing for an
        expert another rank holds (expert parallelism)."""
        held = self.experts.local_experts
        if expert not in held:
            return
        local = expert - held.start
        n, rank = self.intermediate_per_rank, self.shard[1]
        with torch.no_grad():
            if which == "w2":
                self.experts.w2_weight[local].copy_(tensor[:, rank * n:(rank + 1) * n])
            else:
                offset = 0 if which == "w1" else n
                self.experts.w13_weight[local, offset:offset + n].copy_(tensor[rank * n:(rank + 1) * n])


def gpt_oss_routing(hidden_states: torch.Tensor, router_logits: torch.Tensor, top_k: int,
                    renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss's routing (FusedMoE's `custom_routing_function`): the top-k router logits, then a softmax over
    those k only, in the logits' dtype."""
    values, ids = torch.topk(router_logits, top_k, dim=-1)
    return torch.softmax(values, dim=-1, dtype=values.dtype), ids


class GptOssMoE(SparseMoE):
    """gpt-oss's block (`mlp`): a router with bias, `gpt_oss_routing`, and experts with biases computing the
    clamped SwiGLU (FusedMoE's `swigluoai`: alpha 1.702, limit 7.0) on interleaved gate/up features.

    The checkpoint stacks the experts `[experts, in, out]`: `gate_up_proj` `[E, hidden, 2 * inter]` (gate at even
    columns, up at odd) + `gate_up_proj_bias`, `down_proj` `[E, inter, hidden]` + `down_proj_bias`; FusedMoE holds
    them `[E, out, in]`, so they load transposed, with the interleaving kept (what `swigluoai` reads).
    """

    def __init__(self, config: DecoderConfig, dtype: torch.dtype, prefix: str = ""):
        super().__init__(config, dtype, prefix, "router", True, renormalize=False,
                         custom_routing_function=gpt_oss_routing, activation="swigluoai", has_bias=True)

    def load_experts(self, which: str, tensor: torch.Tensor) -> None:
        """Copy this rank's slice of the stacked checkpoint tensor `which` (`gate_up_proj`, `gate_up_proj_bias`,
        `down_proj`, `down_proj_bias`): the experts it holds (all but under expert parallelism), and of each its
        intermediate slice. Interleaved, this rank's gate and up columns are one contiguous range; the down bias is
        added once: under tensor parallelism by rank 0 before the all-reduce, under expert parallelism by the rank
        holding the expert."""
        n, rank = self.intermediate_per_rank, self.shard[1]
        gate_up = slice(2 * rank * n, 2 * (rank + 1) * n)
        held = self.experts.local_experts
        tensor = tensor[held.start:held.stop]
        experts = self.experts
        with torch.no_grad():
            if which == "gate_up_proj":
                experts.w13_weight.copy_(tensor[:, :, gate_up].transpose(1, 2))
            elif which == "gate_up_proj_bias":
                experts.w13_bias.copy_(tensor[:, gate_up])
            elif which == "down_proj":
                experts.w2_weight.copy_(tensor[:, rank * n:(rank + 1) * n].transpose(1, 2))
            else:
                experts.w2_bias.copy_(tensor if rank == 0 else torch.zeros_like(tensor))


def _feed_forward(config: DecoderConfig, dtype: torch.dtype, prefix: str) -> tuple[str, nn.Module]:
    """A layer's MLP or MoE block and the checkpoint name it lives under."""
    if not config.num_experts:
        return "mlp", LlamaMLP(config, dtype, f"{prefix}.mlp")
    if config.moe_style == "gpt_oss":
        return "mlp", GptOssMoE(config, dtype, f"{prefix}.mlp")
    return "block_sparse_moe", MixtralMoE(config, dtype, f"{prefix}.block_sparse_moe")


class LlamaDecoderLayer(nn.Module):
    """RMSNorm -> attention -> residual add, RMSNorm -> MLP / MoE; the residual add is fused into the next norm."""

    def __init__(self, config: DecoderConfig, dtype: torch.dtype, prefix: str = "", layer_index: int = 0,
                 attn_backend: type | str | None = None):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        self.self_attn = LlamaAttention(config, dtype, f"{prefix}.self_attn", layer_index, attn_backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        self.ffn_name, ffn = _feed_forward(config, dtype, prefix)
        self.add_module(self.ffn_name, ffn)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None,
                batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:   # donates hidden_states and residual (fused_add_rms_norm.maybe_inplace)
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, batch)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return getattr(self, self.ffn_name)(hidden_states), residual


class Gemma2DecoderLayer(nn.Module):
    """Gemma-2's layer: Gemma RMSNorm (`x * (1 + w)`, float32) before and after attention and before and after
    the MLP. transformers adds the residual to each post-norm's output; here that add is fused into the next
    pre-norm (`norm(x, residual)`: the sum formed in float32, rounded once, as a same-dtype add rounds)."""

    def __init__(self, config: DecoderConfig, dtype: torch.dtype, prefix: str = "", layer_index: int = 0,
                 attn_backend: type | str | None = None):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.self_attn = LlamaAttention(config, dtype, f"{prefix}.self_attn", layer_index, attn_backend)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.ffn_name, ffn = _feed_forward(config, dtype, prefix)
        self.add_module(self.ffn_name, ffn)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None,
                batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.post_attention_layernorm(self.self_attn(positions, hidden_states, batch))
        hidden_states, residual = self.pre_feedforward_layernorm(hidden_states, residual)
        hidden_states = getattr(self, self.ffn_name)(hidden_states)
        return self.post_feedforward_layernorm(hidden_states), residual


class LlamaModel(nn.Module):
    def __init__(self, config: DecoderConfig, dtype: torch.dtype, attn_backend: type | str | None = None,
                 block_size: int | None = None):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, params_dtype=dtype,
                                                   padding_size=config.padding_size, prefix="model.embed_tokens")
        self.embedding_scale = config.embedding_scale
        gemma = config.norm_style == "gemma2"
        layer_cls = Gemma2DecoderLayer if gemma else LlamaDecoderLayer
        self.layers = nn.ModuleList(layer_cls(config, dtype, f"model.layers.{i}", i, attn_backend)
                                    for i in range(config.num_layers))
        self.norm = (GemmaRMSNorm(config.hidden_size, config.rms_norm_eps) if gemma
                     else RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype))
        self.attention = DecoderAttention([layer.self_attn.attn for layer in self.layers], block_size)
        for layer in self.layers:
            layer.self_attn.decoder_key = self.attention.key

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        if self.embedding_scale != 1.0:   # the scale rounded to the hidden dtype first, as transformers and vLLM do
            hidden_states = hidden_states * torch.tensor(self.embedding_scale, dtype=hidden_states.dtype,
                                                         device=hidden_states.device)
        if batch is not None and not torch.compiler.is_compiling():
            batch = self.attention.step(current_kv_cache(), positions, *batch)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual, batch)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    """`forward(input_ids, positions[, cu_seqlens, seq_lens][, logits_indices]) -> logits [rows, vocab_size]`.

    Without `cu_seqlens` the tokens are one sequence, recomputed whole. With them they are packed
    sequences (`cu_seqlens` `[seqs + 1]` int64 offsets; `seq_lens` `[seqs]` each sequence's length
    once these tokens are in) run against the current KV cache (see `kv_cache`); sequence s is the
    cache's row s. The logits are those of every token, or of the tokens `logits_indices` names (the LM
    head runs on those only). `attn_backend` (a backend class or registry name) overrides the platform's
    choice; `block_size` the KV cache's (default 16, or what the backends declare).
    """

    def __init__(self, config: DecoderConfig, dtype: torch.dtype = torch.float32, *,
                 attn_backend: type | str | None = None, block_size: int | None = None):
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.model = LlamaModel(config, dtype, attn_backend, block_size)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, params_dtype=dtype,
                                      padding_size=config.padding_size, prefix="lm_head")
        if config.tie_word_embeddings:
            self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size, scale=config.logit_scale,
                                                soft_cap=config.final_logit_softcap)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
                seq_lens: torch.Tensor | None = None, logits_indices: torch.Tensor | None = None) -> torch.Tensor:
        if (cu_seqlens is None) != (seq_lens is None):
            raise ValueError("cu_seqlens and seq_lens go together: pass both (KV-cache batch) or neither")
        batch = None if cu_seqlens is None else (cu_seqlens, seq_lens)
        hidden_states = self.model(input_ids, positions, batch)
        if logits_indices is not None:
            hidden_states = hidden_states.index_select(0, logits_indices)
        return self.compute_logits(hidden_states)

    def allocate_kv_cache(self, max_seqs: int, max_len: int, *, num_blocks: int | None = None) -> KVCache:
        """A zeroed paged cache for `max_seqs` sequences of up to `max_len` tokens, this rank's KV heads, in the
        model's dtype, on its device, in blocks its attention backends take; `num_blocks` (the null block
        included) defaults to enough for every sequence at `max_len`."""
        attn = self.model.layers[0].self_attn
        if max_len > self.config.max_position_embeddings:
            raise ValueError(f"max_len={max_len} exceeds max_position_embeddings="
                             f"{self.config.max_position_embeddings}")
        return KVCache.allocate(self.config.num_layers, max_seqs, max_len, attn.num_kv_heads, attn.head_dim,
                                self.dtype, self.lm_head.weight.device, block_size=self.model.attention.block_size,
                                num_blocks=num_blocks)

    @property
    def attention_backends(self) -> list[str]:
        """The names of the attention backends the decoder's layers run on."""
        return self.model.attention.backend_names()

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden_states)

    # ----- weights ------------------------------------------------------------------------------
    _STACKED = (("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
                ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1))

    _EXPERT = re.compile(r"(model\.layers\.\d+\.block_sparse_moe)\.experts\.(\d+)\.(w[123])\.weight")
    _STACKED_EXPERTS = re.compile(r"(model\.layers\.\d+\.mlp)\.experts\.(gate_up_proj|down_proj)(_bias)?")
    _FUSED_MOE_PARAM = {"gate_up_proj": "w13_weight", "gate_up_proj_bias": "w13_bias", "down_proj": "w2_weight",
                        "down_proj_bias": "w2_bias"}
    _SINKS = re.compile(r"(model\.layers\.\d+\.self_attn)\.sinks")

    def load_weights(self, checkpoint: dict[str, torch.Tensor]) -> set[str]:
        """Load a full checkpoint (HF names) onto this rank; returns the parameters loaded.

        Raises ValueError naming a tensor whose shape is not the config's, and KeyError naming
        checkpoint tensors this model has no parameter for, and parameters the checkpoint left out.
        """
        shapes = expected_shapes(self.config)
        params = dict(self.named_parameters(remove_duplicate=False))
        modules = dict(self.named_modules())
        loaded: set[str] = set()
        unknown = []
        for name, tensor in checkpoint.items():
            if self.config.tie_word_embeddings and name == "lm_head.weight":
                continue
            if name not in shapes:
                unknown.append(name)
                continue
            if tuple(tensor.shape) != shapes[name]:
                raise ValueError(f"checkpoint tensor {name} has shape {tuple(tensor.shape)}, the config expects "
                                 f"{shapes[name]}")
            expert = self._EXPERT.fullmatch(name)
            if expert is not None:
                block, index, which = expert.groups()
                modules[block].load_expert(int(index), which, tensor)
                loaded.add(f"{block}.experts.{'w2' if which == 'w2' else 'w13'}_weight")
                continue
            stacked = self._STACKED_EXPERTS.fullmatch(name)
            if stacked is not None:
                block, which = stacked.group(1), stacked.group(2) + (stacked.group(3) or "")
                modules[block].load_experts(which, tensor)
                loaded.add(f"{block}.experts.{self._FUSED_MOE_PARAM[which]}")
                continue
            sinks = self._SINKS.fullmatch(name)
            if sinks is not None:
                modules[sinks.group(1)].load_sinks(tensor)
                loaded.add(name)
                continue
            target, shard_id = name, None
            for fused, part, sid in self._STACKED:
                if f".{part}." in name:
                    target, shard_id = name.replace(f".{part}.", f".{fused}."), sid
                    break
            owner = modules[target.rpartition(".")[0]]
            loader = getattr(owner, "weight_loader", None)
            param = params[target]
            if loader is None:   # plain parameters (norm weights): copy as is
                with torch.no_grad():
                    param.copy_(tensor)
            elif shard_id is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard_id)
            loaded.add(target)
        if unknown:
            raise KeyError(f"checkpoint tensors with no parameter in LlamaForCausalLM: {sorted(unknown)}")
        tied = {"lm_head.weight"} if self.config.tie_word_embeddings else set()
        missing = sorted(set(params) - loaded - tied)
        if missing:
            raise KeyError(f"parameters the checkpoint did not provide: {missing}")
        return loaded


def build_model(config: DecoderConfig, dtype: torch.dtype = torch.float32, seed: int = 0,
                checkpoint: dict[str, torch.Tensor] | None = None,
                device: torch.device | str = "cpu", *, attn_backend: type | str | None = None,
                block_size: int | None = None) -> LlamaForCausalLM:
    """A decoder with the seeded random checkpoint (or `checkpoint`) loaded for this rank; its attention on the
    platform's backend unless `attn_backend` names one.

    Parameters and buffers are created directly on `device` (never on the process default device).
    """
    with torch.device(device):
        model = LlamaForCausalLM(config, dtype, attn_backend=attn_backend, block_size=block_size)
    model.load_weights(checkpoint if checkpoint is not None else random_checkpoint(config, seed, dtype))
    return model.eval()
