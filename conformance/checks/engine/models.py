"""The `engine` family's models and requests: tiny random checkpoints written by transformers' `save_pretrained`
(nothing downloaded) and a fixed batch of token-id prompts built around the engine's KV block size.

Every model has head size 32 (the smallest vLLM 0.32's CPU attention takes) and 2 layers; weights are seeded and
scaled by `randomize_weights` (logits with a spread of a few units, so greedy margins are wide), then stored in the
dtype under test, so the engine and the oracle read the same numbers.
The requests come in two waves: the first batch has prompts of different lengths (the longest beyond the chunked
prefill's token budget) and different generation lengths, so the batch shrinks while it decodes; the second wave's
prompts start with whole blocks of first-wave prompts, so the prefix cache serves them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

MODEL_SEED = 311
PROMPT_SEED = 312
VOCAB = 512
BASE = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, max_position_embeddings=2048, rms_norm_eps=1e-6)


@dataclasses.dataclass(frozen=True)
class EngineModel:
    """A model of the family: its transformers config class and the keys it sets on top of BASE, and what of the
    engine it exercises (said in every verdict)."""

    name: str
    config_class: str
    kwargs: dict[str, Any]
    exercises: str
    level: str = "standard"     # the first level whose eager units run it

    @property
    def moe(self) -> bool:
        """Whether it routes tokens to experts (gpt-oss, Mixtral)."""
        return "num_local_experts" in self.kwargs


MODELS = {
    "llama": EngineModel("llama", "LlamaConfig", {}, "GQA 4 query heads on 2 KV heads"),
    # Qwen2's biases and tied head and Mistral's window are also in Gemma-2 and gpt-oss: full only, for the time
    "qwen2": EngineModel("qwen2", "Qwen2Config", {"tie_word_embeddings": True, "use_sliding_window": False},
                         "q/k/v biases, tied embeddings", level="full"),
    "mistral": EngineModel("mistral", "MistralConfig", {"sliding_window": 48},
                           "a 48-token sliding window, shorter than the prompts", level="full"),
    # vLLM's Gemma-2 ties the LM head to the embeddings and takes only the tanh GELU; layer 0 slides, layer 1 is full
    "gemma2": EngineModel("gemma2", "Gemma2Config", {"tie_word_embeddings": True, "query_pre_attn_scalar": 8,
                                                      "attn_logit_softcapping": 3.0, "final_logit_softcapping": 8.0,
                                                      "sliding_window": 48, "hidden_activation": "gelu_pytorch_tanh"},
                          "attention and final logit soft caps (3 and 8), a 48-token window on alternating layers, "
                          "Gemma norms and embedding scale"),
    # vLLM's gpt-oss always builds YaRN from every key below; its MoE is unquantized here (bf16 / fp32 experts)
    "gpt_oss": EngineModel("gpt_oss", "GptOssConfig", {"num_local_experts": 4, "num_experts_per_tok": 2,
                                                        "sliding_window": 48, "rope_parameters": {
                                                            "rope_type": "yarn", "rope_theta": 150000.0,
                                                            "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                                            "truncate": False,
                                                            "original_max_position_embeddings": 512}},
                           "attention sinks, a 48-token window on alternating layers, YaRN, MoE with biases and "
                           "clamped SwiGLU, 4 experts, top 2"),
    "mixtral": EngineModel("mixtral", "MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2,
                                                        "sliding_window": None},
                           "MoE, 4 experts, top 2", level="full"),
}


def models_at(level: str) -> list[str]:
    """The models an eager unit runs at `level`: Llama, Gemma-2 and gpt-oss at standard (between them GQA, biases,
    a tied head, soft caps, sinks, windows on alternating layers, MoE); Qwen2, Mistral and Mixtral add at full."""
    order = ("quick", "standard", "full")
    return [name for name, m in MODELS.items() if order.index(m.level) <= order.index(level)]


def randomize_weights(hf: torch.nn.Module, seed: int) -> None:
    """Seeded weights for a transformers model whose logits spread over a few units (transformers' 0.02 init
    leaves near-ties for greedy), drawn in float32 on the CPU.

    Projections ~ N(0, 1/fan_in), with gpt-oss's stacked experts `[experts, in, out]` (fan-in: dim -2); norm
    weights ~ 1 + N(0, 0.1^2), or N(0, 0.1^2) for Gemma's norms, which multiply by 1 + w; biases ~ N(0, 0.1^2);
    gpt-oss's sinks ~ N(0, 2^2), so that they take a share of the softmax worth seeing; the LM head, and the
    embeddings where they double as it, ~ N(0, (3/sqrt(hidden))^2); untied embeddings ~ N(0, 1)
    (Gemma's ~ N(0, 1/hidden)).
    """
    config = hf.config
    gen = torch.Generator().manual_seed(seed)
    hidden = config.hidden_size
    tied = bool(getattr(config, "tie_word_embeddings", False))
    gemma = config.model_type == "gemma2"
    norm_mean = 0.0 if gemma else 1.0
    with torch.no_grad():
        for name, param in sorted(hf.named_parameters()):
            if name.endswith("norm.weight"):
                std, mean = 0.1, norm_mean
            elif name.endswith("bias"):
                std, mean = 0.1, 0.0
            elif name.endswith(".sinks"):
                std, mean = 2.0, 0.0
            elif name == "model.embed_tokens.weight":   # Gemma scales them by sqrt(hidden) on the way in
                std, mean = (3.0 * hidden ** -0.5 if tied else hidden ** -0.5 if gemma else 1.0), 0.0
            elif name == "lm_head.weight":
                std, mean = 3.0 * hidden ** -0.5, 0.0
            elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                std, mean = param.shape[-2] ** -0.5, 0.0
            else:
                std, mean = param.shape[-1] ** -0.5, 0.0
            param.copy_((torch.randn(tuple(param.shape), generator=gen) * std + mean).to(param.dtype))


def write_checkpoint(model: EngineModel, dtype: torch.dtype, directory: Path, seed: int = MODEL_SEED) -> Path:
    """`save_pretrained` of a transformers model of `model`'s config with weights seeded by `seed` (the family's
    MODEL_SEED; others only to measure how a model of that shape behaves) stored in `dtype`."""
    import transformers

    config = getattr(transformers, model.config_class)(**BASE, **model.kwargs, dtype=str(dtype).removeprefix("torch."))
    with torch.device("cpu"):
        hf = getattr(transformers, config.architectures[0] if config.architectures else
                     model.config_class.replace("Config", "ForCausalLM"))(config)
    randomize_weights(hf, seed)
    hf.to(dtype).save_pretrained(str(directory))
    return directory


@dataclasses.dataclass(frozen=True)
class Request:
    """One request: its id (its place in the batch), wave, prompt token ids and how many tokens to generate."""

    id: int
    wave: int
    prompt: tuple[int, ...]
    max_tokens: int

    def describe(self) -> str:
        return f"request {self.id} (wave {self.wave}, prompt of {len(self.prompt)} tokens, {self.max_tokens} generated)"


def requests(block_size: int, seed: int = PROMPT_SEED) -> list[Request]:
    """The fixed requests for an engine whose KV blocks hold `block_size` tokens (prompts drawn on the CPU with
    `seed`: the family's PROMPT_SEED; others only to measure)."""
    gen = torch.Generator().manual_seed(seed)

    def draw(n: int) -> tuple[int, ...]:
        return tuple(torch.randint(3, VOCAB, (n,), generator=gen).tolist())

    b = block_size
    first = [draw(b + b // 2 + 3), draw(9), draw(2 * b + 5), draw(b // 2 + 1)]
    reqs = [Request(i, 0, p, n) for i, (p, n) in enumerate(zip(first, (10, 3, 12, 6)))]
    # the second wave starts with whole blocks of first-wave prompts: prefix-cache hits of 2 blocks and 1 block
    second = [first[2][: 2 * b] + draw(7), first[0][:b] + draw(b // 4 + 2)]
    reqs += [Request(4 + i, 1, p, n) for i, (p, n) in enumerate(zip(second, (8, 5)))]
    return reqs


# The chunked prefill's tokens per step, set before the engine picks its block size: below the longest prompt for
# any block of 16 tokens or more, so that prompt's prefill spans steps and shares them with other requests.
TOKEN_BUDGET = 32
MAX_MODEL_LEN = 1024      # room for the prompts at blocks of up to 256 tokens


def to_json(reqs: list[Request]) -> list[list[dict]]:
    """The requests as the engine runner's waves: a list per wave of {id, prompt, max_tokens}."""
    waves: list[list[dict]] = [[] for _ in range(max(r.wave for r in reqs) + 1)]
    for r in reqs:
        waves[r.wave].append({"id": r.id, "prompt": list(r.prompt), "max_tokens": r.max_tokens})
    return [w for w in waves if w]


# The KV block sizes the requests are laid out for in advance (the engine picks its own; the engine process takes the
# layout for the one it chose): from the smallest the chunked prefill still spans (below 16 the longest prompt fits
# one 32-token step) to the largest MAX_MODEL_LEN has room for.
BLOCK_SIZES = (16, 32, 64, 128, 256)


def waves_by_block_size() -> dict:
    """The fixed requests as the engine runner's `{"by_block_size": {block size: waves}}`, for every BLOCK_SIZES."""
    return {"by_block_size": {str(b): to_json(requests(b)) for b in BLOCK_SIZES}}


def from_json(waves: list[list[dict]]) -> list[Request]:
    return [Request(int(r["id"]), i, tuple(r["prompt"]), int(r["max_tokens"])) for i, w in enumerate(waves) for r in w]
