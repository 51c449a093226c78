"""Shapes of widely used open models, for the op cases: the sizes real serving runs kernels at.

Every number comes from the model's `config.json` on the Hugging Face Hub (the model id is the
`name`; the fields are those of its config, named in each comment), except `is_neox_style`, which is
the rotary style vLLM's model implementation passes to `get_rope` (GPT-J and DeepSeek's MLA use
interleaved pairs, the others rotate halves). Derived values say how they are derived: `head_dim` is
`hidden_size / num_attention_heads` unless the config gives `head_dim`; `rotary_dim` is
`head_dim * partial_rotary_factor` (GPT-NeoX/Pythia's `rotary_pct`, GPT-J's `rotary_dim`, Phi-2's
`partial_rotary_factor`), and DeepSeek's MLA rotates `qk_rope_head_dim` features of one shared key
head. The op modules (layernorm, activation, rotary, quant) draw their real-model cases from
`MODELS`, so partial rotary (rot 16, 20, 24, 32, 64) and sizes that are no power of two are always
covered at the standard level. This module imports nothing of reference_impl: any case may use it.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelShapes:
    """The sizes of one model that the IR ops see (per token: hidden, intermediate, heads)."""

    name: str                    # Hugging Face model id whose config.json the numbers come from
    hidden_size: int             # hidden_size (GPT-J: n_embd)
    intermediate_size: int       # intermediate_size (GPT-J: n_inner, null = 4 * n_embd; Falcon: 4 * hidden_size)
    num_heads: int               # num_attention_heads (GPT-J: n_head)
    num_kv_heads: int            # num_key_value_heads (Falcon-7B: multi_query -> 1; Falcon-40B: num_kv_heads)
    head_dim: int
    rotary_dim: int
    is_neox_style: bool
    vocab_size: int              # vocab_size
    moe_intermediate_size: int | None = None    # moe_intermediate_size (DeepSeek), per routed expert
    rope_key_heads: int | None = None   # MLA (DeepSeek): the rotary op's key is one head shared by all (k_pe)

    @property
    def gqa_ratio(self) -> int:
        """Query heads per key/value head (1: multi-head, num_heads: multi-query)."""
        return self.num_heads // self.num_kv_heads

    @property
    def rope_ratio(self) -> int:
        """Query heads per key head as the rotary op sees them (MLA: all query heads share one rope key head)."""
        return self.num_heads // (self.rope_key_heads or self.num_kv_heads)

    @property
    def short_name(self) -> str:
        return self.name.rpartition("/")[2]


MODELS: tuple[ModelShapes, ...] = (
    # hidden 4096, intermediate 14336, heads 32 / kv 8 (head 128), vocab 128256, rope_theta 500000
    ModelShapes("meta-llama/Meta-Llama-3-8B", 4096, 14336, 32, 8, 128, 128, True, 128256),
    # hidden 8192, intermediate 28672, heads 64 / kv 8 (head 128), vocab 128256
    ModelShapes("meta-llama/Meta-Llama-3-70B", 8192, 28672, 64, 8, 128, 128, True, 128256),
    # hidden 4096, intermediate 14336, heads 32 / kv 8, vocab 32000
    ModelShapes("mistralai/Mistral-7B-v0.1", 4096, 14336, 32, 8, 128, 128, True, 32000),
    # hidden 4096, intermediate 14336 (per expert; num_local_experts 8, num_experts_per_tok 2), heads 32 / kv 8
    ModelShapes("mistralai/Mixtral-8x7B-v0.1", 4096, 14336, 32, 8, 128, 128, True, 32000),
    # hidden 3584, intermediate 18944, heads 28 / kv 4 (head 128), vocab 152064
    ModelShapes("Qwen/Qwen2-7B", 3584, 18944, 28, 4, 128, 128, True, 152064),
    # hidden 3584, intermediate 18944, heads 28 / kv 4, vocab 152064
    ModelShapes("Qwen/Qwen2.5-7B", 3584, 18944, 28, 4, 128, 128, True, 152064),
    # hidden 896, intermediate 4864, heads 14 / kv 2 (head 64), vocab 151936
    ModelShapes("Qwen/Qwen2.5-0.5B", 896, 4864, 14, 2, 64, 64, True, 151936),
    # hidden 2304, intermediate 9216, heads 8 / kv 4, head_dim 256, vocab 256000
    ModelShapes("google/gemma-2-2b", 2304, 9216, 8, 4, 256, 256, True, 256000),
    # hidden 3584, intermediate 14336, heads 16 / kv 8, head_dim 256, vocab 256000
    ModelShapes("google/gemma-2-9b", 3584, 14336, 16, 8, 256, 256, True, 256000),
    # hidden 3072, intermediate 8192, heads 32 / kv 32 (head 96), vocab 32064
    ModelShapes("microsoft/Phi-3-mini-4k-instruct", 3072, 8192, 32, 32, 96, 96, True, 32064),
    # hidden 2560, intermediate 10240, heads 32 (head 80), partial_rotary_factor 0.4 -> rot 32, vocab 51200
    ModelShapes("microsoft/phi-2", 2560, 10240, 32, 32, 80, 32, True, 51200),
    # hidden 6144, intermediate 24576, heads 64 (head 96), rotary_pct 0.25 -> rot 24, vocab 50432
    ModelShapes("EleutherAI/gpt-neox-20b", 6144, 24576, 64, 64, 96, 24, True, 50432),
    # hidden 2560, intermediate 10240, heads 32 (head 80), rotary_pct 0.25 -> rot 20, vocab 50304
    ModelShapes("EleutherAI/pythia-2.8b", 2560, 10240, 32, 32, 80, 20, True, 50304),
    # hidden 1024, intermediate 4096, heads 16 (head 64), rotary_pct 0.25 -> rot 16, vocab 50304
    ModelShapes("EleutherAI/pythia-410m", 1024, 4096, 16, 16, 64, 16, True, 50304),
    # n_embd 4096, n_inner null (4 * 4096), n_head 16 (head 256), rotary_dim 64, vocab 50400; GPT-J style
    ModelShapes("EleutherAI/gpt-j-6b", 4096, 16384, 16, 16, 256, 64, False, 50400),
    # hidden 4544 (= 64 * 71), heads 71 (head 64), multi_query (one kv head), vocab 65024; mlp 4 * hidden
    ModelShapes("tiiuae/falcon-7b", 4544, 18176, 71, 1, 64, 64, True, 65024),
    # hidden 2560, intermediate 6912, heads 32 / kv 32 (head 80), partial_rotary_factor 0.25 -> rot 20, vocab 50304
    ModelShapes("stabilityai/stablelm-3b-4e1t", 2560, 6912, 32, 32, 80, 20, True, 50304),
    # hidden 7168, intermediate 18432, moe_intermediate 2048, heads 128, qk_rope_head_dim 64 (MLA: one shared
    # rope key head), vocab 129280; interleaved rotary
    ModelShapes("deepseek-ai/DeepSeek-V3", 7168, 18432, 128, 128, 64, 64, False, 129280, 2048, rope_key_heads=1),
    # hidden 2048, intermediate 10944, moe_intermediate 1408, heads 16, qk_rope_head_dim 64, vocab 102400
    ModelShapes("deepseek-ai/DeepSeek-V2-Lite", 2048, 10944, 16, 16, 64, 64, False, 102400, 1408, rope_key_heads=1),
)

# Head sizes vLLM's CPU attention backend supports (vllm/v1/attention/backends/cpu_attn.py,
# get_supported_head_sizes) that no model above has: a kernel may still be handed them.
EXTRA_HEAD_SIZES = (112,)


def by_name(short_name: str) -> ModelShapes:
    """The model whose id ends with `short_name` (e.g. 'pythia-2.8b'); KeyError naming the known ones."""
    for model in MODELS:
        if model.short_name == short_name:
            return model
    raise KeyError(f"no model {short_name!r} in the table; known: {', '.join(m.short_name for m in MODELS)}")


def first_model_per(size_of) -> list[tuple[int, str]]:
    """[(size, short name of the first model with it)] for `size_of(model)` over MODELS, in table order,
    sizes that are a power of two (already everywhere in the declared cases) and None left out."""
    found: dict[int, str] = {}
    for m in MODELS:
        size = size_of(m)
        if size is not None and size & (size - 1):
            found.setdefault(size, m.short_name)
    return list(found.items())
