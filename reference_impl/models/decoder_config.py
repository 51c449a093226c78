"""The shape of the reference decoder (models/llama.py): DecoderConfig, and GATED_ACTIVATIONS, the
`hidden_act` values its MLP can compute.

The config covers the Llama-shaped families' variants: a Mixtral-style sparse MoE MLP, rope scaling
(models/rope.py), projection biases (Qwen2's q/k/v, Llama's attention_bias / mlp_bias), a sliding
attention window (Mistral, Qwen2) and a gelu-gated MLP; and the two families whose layers differ:
Gemma-2 (`norm_style="gemma2"`, a scaled embedding, soft caps, a query scale of its own) and gpt-oss
(`moe_style="gpt_oss"`, attention sinks). models/hf_config.py reads it from (and writes it to) a
transformers `config.json`; models/weights.py gives the checkpoint tensors it implies.
"""

from __future__ import annotations

import dataclasses

from reference_impl.layers.activation import GeluAndMul, SiluAndMul
from reference_impl.models.rope import RopeScaling

# hidden_act of a transformers config -> the gated layer computing act(gate) * up (vLLM's and-mul
# registry; gelu_new is the tanh approximation's formula written out)
GATED_ACTIVATIONS = {
    "silu": lambda: SiluAndMul(),
    "swish": lambda: SiluAndMul(),
    "gelu": lambda: GeluAndMul("none"),
    "gelu_pytorch_tanh": lambda: GeluAndMul("tanh"),
    "gelu_new": lambda: GeluAndMul("tanh"),
}
# the layer layouts of models/llama.py: how a layer normalizes, and what its sparse MoE block computes
NORM_STYLES = ("llama", "gemma2")
MOE_STYLES = ("mixtral", "gpt_oss")


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Shape of the decoder; the defaults are the tiny model (hidden 64, 2 layers, vocab 300).

    `num_experts` > 0 makes every MLP a Mixtral-style sparse MoE block (`num_experts_per_tok` of
    them per token, each of width `intermediate_size`). `sliding_window` W lets a token attend to
    the W positions ending at its own, on `sliding_window_layers` (None: every layer).

    Gemma-2 and gpt-oss:
    - `norm_style` "llama": RMSNorm `x * w` before attention and before the MLP. "gemma2": Gemma's RMSNorm
      `x * (1 + w)` (float32) before and after each of attention and the MLP (four per layer).
    - `embedding_scale`: the embeddings are multiplied by it, in the hidden dtype (Gemma: sqrt(hidden_size)).
    - `query_pre_attn_scalar` S: attention scores are scaled by S ** -0.5 instead of head_dim ** -0.5.
    - `attn_logit_softcap` c: attention scores become `c * tanh(s / c)` before the mask and softmax;
      `final_logit_softcap` does the same to the logits.
    - `attention_sinks`: each head has a learned logit (`self_attn.sinks`) in its softmax denominator only.
    - `moe_style` "mixtral": router without bias, softmax over all experts, top-k renormalized, SiLU-gated
      experts without biases. "gpt_oss": router with bias, top-k of the logits then softmax over those k,
      experts with biases computing the clamped SwiGLU (alpha 1.702, limit 7.0) on interleaved gate/up.
    """

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
    num_experts: int = 0
    num_experts_per_tok: int = 2
    rope_scaling: RopeScaling | None = None
    hidden_act: str = "silu"
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    sliding_window_layers: tuple[int, ...] | None = None
    norm_style: str = "llama"
    embedding_scale: float = 1.0
    query_pre_attn_scalar: float | None = None
    attn_logit_softcap: float | None = None
    attention_sinks: bool = False
    moe_style: str = "mixtral"

    def __post_init__(self):
        if self.norm_style not in NORM_STYLES:
            raise ValueError(f"norm_style={self.norm_style!r} is not one of {NORM_STYLES}")
        if self.moe_style not in MOE_STYLES:
            raise ValueError(f"moe_style={self.moe_style!r} is not one of {MOE_STYLES}")
        for name in ("embedding_scale", "query_pre_attn_scalar", "attn_logit_softcap", "final_logit_softcap"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name}={value!r} must be positive")
        if self.hidden_act not in GATED_ACTIVATIONS:
            raise ValueError(f"hidden_act={self.hidden_act!r} is not supported; supported: "
                             f"{', '.join(GATED_ACTIVATIONS)}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window={self.sliding_window} must be a positive number of tokens")
        if self.sliding_window_layers is not None and not all(0 <= i < self.num_layers
                                                              for i in self.sliding_window_layers):
            raise ValueError(f"sliding_window_layers={self.sliding_window_layers} must be layers in "
                             f"[0, {self.num_layers})")
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} must be in [1, "
                             f"num_experts={self.num_experts}]")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even (rotary embedding)")

    @property
    def attention_scale(self) -> float:
        """The factor attention scores are scaled by: query_pre_attn_scalar ** -0.5, else head_dim ** -0.5."""
        return (self.query_pre_attn_scalar if self.query_pre_attn_scalar is not None else self.head_dim) ** -0.5

    def attention_window(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window in tokens, or None (full causal attention)."""
        if self.sliding_window is None:
            return None
        if self.sliding_window_layers is not None and layer not in self.sliding_window_layers:
            return None
        return self.sliding_window
