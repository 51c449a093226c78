"""The full (unsharded) checkpoint a DecoderConfig implies, with Hugging Face tensor names (Llama / Mixtral, Gemma-2's
extra norms, gpt-oss's sinks, router and stacked experts):
`expected_shapes` (every tensor and its shape, which LlamaForCausalLM.load_weights checks a checkpoint
against) and `random_checkpoint` (a seeded one, for tests, demos and models/llama.py's `build_model`).
"""

from __future__ import annotations

import torch

from reference_impl.models.decoder_config import DecoderConfig


def expected_shapes(config: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a full checkpoint (HF names, unsharded) and its shape, in checkpoint order."""
    h, inter, d = config.hidden_size, config.intermediate_size, config.head_dim
    shapes = {"model.embed_tokens.weight": (config.vocab_size, h)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}"
        shapes[f"{p}.input_layernorm.weight"] = (h,)
        for proj, rows in (("q", config.num_heads * d), ("k", config.num_kv_heads * d), ("v", config.num_kv_heads * d)):
            shapes[f"{p}.self_attn.{proj}_proj.weight"] = (rows, h)
            if config.qkv_bias:
                shapes[f"{p}.self_attn.{proj}_proj.bias"] = (rows,)
        shapes[f"{p}.self_attn.o_proj.weight"] = (h, config.num_heads * d)
        if config.o_proj_bias:
            shapes[f"{p}.self_attn.o_proj.bias"] = (h,)
        if config.attention_sinks:
            shapes[f"{p}.self_attn.sinks"] = (config.num_heads,)
        shapes[f"{p}.post_attention_layernorm.weight"] = (h,)
        if config.norm_style == "gemma2":
            shapes[f"{p}.pre_feedforward_layernorm.weight"] = (h,)
            shapes[f"{p}.post_feedforward_layernorm.weight"] = (h,)
        if config.num_experts and config.moe_style == "gpt_oss":   # stacked experts, [in, out] per expert
            e = config.num_experts
            shapes.update({f"{p}.mlp.router.weight": (e, h), f"{p}.mlp.router.bias": (e,),
                           f"{p}.mlp.experts.gate_up_proj": (e, h, 2 * inter),
                           f"{p}.mlp.experts.gate_up_proj_bias": (e, 2 * inter),
                           f"{p}.mlp.experts.down_proj": (e, inter, h), f"{p}.mlp.experts.down_proj_bias": (e, h)})
        elif config.num_experts:
            shapes[f"{p}.block_sparse_moe.gate.weight"] = (config.num_experts, h)
            for e in range(config.num_experts):
                q = f"{p}.block_sparse_moe.experts.{e}"
                shapes[f"{q}.w1.weight"] = (inter, h)
                shapes[f"{q}.w3.weight"] = (inter, h)
                shapes[f"{q}.w2.weight"] = (h, inter)
        else:
            shapes[f"{p}.mlp.gate_proj.weight"] = (inter, h)
            shapes[f"{p}.mlp.up_proj.weight"] = (inter, h)
            shapes[f"{p}.mlp.down_proj.weight"] = (h, inter)
            if config.mlp_bias:
                shapes.update({f"{p}.mlp.gate_proj.bias": (inter,), f"{p}.mlp.up_proj.bias": (inter,),
                               f"{p}.mlp.down_proj.bias": (h,)})
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    return shapes


def random_checkpoint(config: DecoderConfig, seed: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A seeded full checkpoint (HF Llama / Mixtral names, unsharded) whose logits spread over a few units.

    Values are drawn in float32 on the CPU and then cast, so every dtype and rank sees the same
    model. Projections (router included) ~ N(0, 1/fan_in); norm weights ~ 1 + N(0, 0.1^2) (Gemma's,
    which add 1 themselves, N(0, 0.1^2)); embeddings ~ N(0, 1) (over sqrt(hidden) when the model scales
    them by it); the LM head ~ N(0, (3/sqrt(hidden))^2), so logits have a standard deviation of about 3;
    biases ~ N(0, 0.1^2); attention sinks ~ N(0, 1).
    """
    gen = torch.Generator().manual_seed(seed)
    ckpt = {}
    for name, shape in expected_shapes(config).items():
        if name.endswith("norm.weight"):
            std, mean = 0.1, 0.0 if config.norm_style == "gemma2" else 1.0
        elif name.endswith((".bias", "_bias")):
            std, mean = 0.1, 0.0
        elif name.endswith(".sinks"):
            std, mean = 1.0, 0.0
        elif name == "model.embed_tokens.weight":
            std, mean = 1.0 / config.embedding_scale, 0.0
        elif name == "lm_head.weight":
            std, mean = 3.0 * config.hidden_size ** -0.5, 0.0
        elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):   # stored [experts, in, out]
            std, mean = shape[-2] ** -0.5, 0.0
        else:
            std, mean = shape[-1] ** -0.5, 0.0
        ckpt[name] = (torch.randn(shape, generator=gen, device="cpu") * std + mean).to(dtype)
    return ckpt
