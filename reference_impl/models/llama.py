"""A small Llama-shaped decoder built from the reference layers, for end-to-end runs and the model check.

Embedding (VocabParallelEmbedding) -> N x [RMSNorm, attention (QKV column-parallel projection,
rotary, causal SDPA over the whole sequence, row-parallel output projection), RMSNorm, MLP
(merged gate/up column-parallel projection, SiluAndMul, row-parallel down projection)] -> RMSNorm
-> ParallelLMHead + LogitsProcessor. The residual stream goes through `RMSNorm(x, residual)`
(IR `fused_add_rms_norm.maybe_inplace`). One sequence of `num_tokens` ids, no KV cache.
Weights come from a full (unsharded) checkpoint dict: `random_checkpoint` makes a seeded one and
`load_weights` shards it onto this rank through the layers' weight loaders.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference_impl.layers.activation import SiluAndMul
from reference_impl.layers.layernorm import RMSNorm
from reference_impl.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from reference_impl.layers.logits_processor import LogitsProcessor
from reference_impl.layers.rotary_embedding import RotaryEmbedding
from reference_impl.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Shape of the decoder; the defaults are the tiny model (hidden 64, 2 layers, vocab 300)."""

    vocab_size: int = 300
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    rope_theta: float = 10000.0
    max_position_embeddings: int = 256
    rms_norm_eps: float = 1e-6
    padding_size: int = 64
    logit_scale: float = 1.0
    final_logit_softcap: float | None = None
    tie_word_embeddings: bool = False

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even (rotary embedding)")


class LlamaAttention(nn.Module):
    """Causal self-attention of one sequence; this rank's heads, output projection all-reduced."""

    def __init__(self, config: DecoderConfig, dtype: torch.dtype, prefix: str = ""):
        super().__init__()
        self.head_dim = config.head_dim
        self.qkv_proj = QKVParallelLinear(config.hidden_size, config.head_dim, config.num_heads, config.num_kv_heads,
                                          bias=False, params_dtype=dtype, prefix=f"{prefix}.qkv_proj")
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(config.num_heads * config.head_dim, config.hidden_size, bias=False,
                                        params_dtype=dtype, prefix=f"{prefix}.o_proj")
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.head_dim, config.max_position_embeddings,
                                          config.rope_theta, True, dtype)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        n = hidden_states.shape[0]
        q = q.reshape(n, self.num_heads, self.head_dim).transpose(0, 1).unsqueeze(0)
        k = k.reshape(n, self.num_kv_heads, self.head_dim).transpose(0, 1).unsqueeze(0)
        v = v.reshape(n, self.num_kv_heads, self.head_dim).transpose(0, 1).unsqueeze(0)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.head_dim ** -0.5,
                                              enable_gqa=self.num_heads != self.num_kv_heads)
        attn = attn.squeeze(0).transpose(0, 1).reshape(n, self.q_size)
        out, _ = self.o_proj(attn)
        return out


class LlamaMLP(nn.Module):
    def __init__(self, config: DecoderConfig, dtype: torch.dtype, prefix: str = ""):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [config.intermediate_size] * 2, bias=False,
                                                       params_dtype=dtype, prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, bias=False,
                                           params_dtype=dtype, prefix=f"{prefix}.down_proj")
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        out, _ = self.down_proj(self.act_fn(gate_up))
        return out


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: DecoderConfig, dtype: torch.dtype, prefix: str = ""):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        self.self_attn = LlamaAttention(config, dtype, f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        self.mlp = LlamaMLP(config, dtype, f"{prefix}.mlp")

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:   # donates hidden_states and residual (fused_add_rms_norm.maybe_inplace)
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaModel(nn.Module):
    def __init__(self, config: DecoderConfig, dtype: torch.dtype):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, params_dtype=dtype,
                                                   padding_size=config.padding_size, prefix="model.embed_tokens")
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, dtype, f"model.layers.{i}")
                                    for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    """`forward(input_ids, positions) -> logits [num_tokens, vocab_size]` of one sequence."""

    def __init__(self, config: DecoderConfig, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.model = LlamaModel(config, dtype)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, params_dtype=dtype,
                                      padding_size=config.padding_size, prefix="lm_head")
        if config.tie_word_embeddings:
            self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size, scale=config.logit_scale,
                                                soft_cap=config.final_logit_softcap)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.compute_logits(self.model(input_ids, positions))

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden_states)

    # ----- weights ------------------------------------------------------------------------------
    _STACKED = (("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
                ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1))

    def load_weights(self, checkpoint: dict[str, torch.Tensor]) -> set[str]:
        """Load a full checkpoint (HF Llama names) through the layers' weight loaders; returns what loaded.

        Raises KeyError naming checkpoint tensors this model has no parameter for, and parameters the
        checkpoint left out.
        """
        params = dict(self.named_parameters(remove_duplicate=False))
        modules = dict(self.named_modules())
        loaded: set[str] = set()
        unknown = []
        for name, tensor in checkpoint.items():
            if self.config.tie_word_embeddings and name == "lm_head.weight":
                continue
            target, shard_id = name, None
            for fused, part, sid in self._STACKED:
                if f".{part}." in name:
                    target, shard_id = name.replace(f".{part}.", f".{fused}."), sid
                    break
            if target not in params:
                unknown.append(name)
                continue
            owner = modules[target.rpartition(".")[0]]
            loader = getattr(owner, "weight_loader", None)
            param = params[target]
            if loader is None:   # plain parameters (norm weights): copy as is
                if tuple(tensor.shape) != tuple(param.shape):
                    raise ValueError(f"checkpoint tensor {name} has shape {tuple(tensor.shape)}, parameter {target} "
                                     f"has {tuple(param.shape)}")
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


def random_checkpoint(config: DecoderConfig, seed: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A seeded full checkpoint (HF Llama names, unsharded) whose logits spread over a few units.

    Values are drawn in float32 on the CPU and then cast, so every dtype and rank sees the same
    model. Projections ~ N(0, 1/fan_in); norm weights ~ 1 + N(0, 0.1^2); embeddings ~ N(0, 1);
    the LM head ~ N(0, (3/sqrt(hidden))^2), so logits have a standard deviation of about 3.
    """
    gen = torch.Generator().manual_seed(seed)
    h, inter, d = config.hidden_size, config.intermediate_size, config.head_dim

    def normal(*shape, std=1.0, mean=0.0):
        return (torch.randn(shape, generator=gen, device="cpu") * std + mean).to(dtype)

    ckpt = {"model.embed_tokens.weight": normal(config.vocab_size, h)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}"
        ckpt[f"{p}.input_layernorm.weight"] = normal(h, std=0.1, mean=1.0)
        ckpt[f"{p}.self_attn.q_proj.weight"] = normal(config.num_heads * d, h, std=h ** -0.5)
        ckpt[f"{p}.self_attn.k_proj.weight"] = normal(config.num_kv_heads * d, h, std=h ** -0.5)
        ckpt[f"{p}.self_attn.v_proj.weight"] = normal(config.num_kv_heads * d, h, std=h ** -0.5)
        ckpt[f"{p}.self_attn.o_proj.weight"] = normal(h, config.num_heads * d, std=(config.num_heads * d) ** -0.5)
        ckpt[f"{p}.post_attention_layernorm.weight"] = normal(h, std=0.1, mean=1.0)
        ckpt[f"{p}.mlp.gate_proj.weight"] = normal(inter, h, std=h ** -0.5)
        ckpt[f"{p}.mlp.up_proj.weight"] = normal(inter, h, std=h ** -0.5)
        ckpt[f"{p}.mlp.down_proj.weight"] = normal(h, inter, std=inter ** -0.5)
    ckpt["model.norm.weight"] = normal(h, std=0.1, mean=1.0)
    if not config.tie_word_embeddings:
        ckpt["lm_head.weight"] = normal(config.vocab_size, h, std=3.0 * h ** -0.5)
    return ckpt


def build_model(config: DecoderConfig, dtype: torch.dtype = torch.float32, seed: int = 0,
                checkpoint: dict[str, torch.Tensor] | None = None,
                device: torch.device | str = "cpu") -> LlamaForCausalLM:
    """A decoder with the seeded random checkpoint (or `checkpoint`) loaded for this rank.

    Parameters and buffers are created directly on `device` (never on the process default device).
    """
    with torch.device(device):
        model = LlamaForCausalLM(config, dtype)
    model.load_weights(checkpoint if checkpoint is not None else random_checkpoint(config, seed, dtype))
    return model.eval()
