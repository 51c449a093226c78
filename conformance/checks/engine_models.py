"""The `engine` family's models and requests: tiny random checkpoints written by transformers' `save_pretrained`
(nothing downloaded) and a fixed batch of token-id prompts built around the engine's KV block size.

Every model has head size 32 (the smallest vLLM 0.32's CPU attention takes) and 2 layers; weights are seeded and
scaled as `reference_impl.models.random_checkpoint` scales them (logits with a spread of a few units, so greedy
margins are wide), then stored in the dtype under test, so the engine and the oracle read the same numbers.
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


MODELS = {
    "llama": EngineModel("llama", "LlamaConfig", {}, "GQA 4 query heads on 2 KV heads"),
    "qwen2": EngineModel("qwen2", "Qwen2Config", {"tie_word_embeddings": True, "use_sliding_window": False},
                         "q/k/v biases, tied embeddings"),
    "mistral": EngineModel("mistral", "MistralConfig", {"sliding_window": 48},
                           "a 48-token sliding window, shorter than the prompts"),
    "mixtral": EngineModel("mixtral", "MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2,
                                                        "sliding_window": None},
                           "MoE, 4 experts, top 2", level="full"),
}
# not in the family: Gemma-2 (soft cap, alternating windows) and gpt-oss (sinks) have no oracle in the reference
# runtime (reference_impl.models reads Llama, Mistral, Qwen2 and Mixtral checkpoints)


def models_at(level: str) -> list[str]:
    """The models an eager unit runs at `level` (Mixtral's MoE engine costs the most: full only)."""
    order = ("quick", "standard", "full")
    return [name for name, m in MODELS.items() if order.index(m.level) <= order.index(level)]


def write_checkpoint(model: EngineModel, dtype: torch.dtype, directory: Path) -> Path:
    """`save_pretrained` of a transformers model of `model`'s config with seeded weights stored in `dtype`."""
    import transformers

    config = getattr(transformers, model.config_class)(**BASE, **model.kwargs, dtype=str(dtype).removeprefix("torch."))
    with torch.device("cpu"):
        hf = getattr(transformers, config.architectures[0] if config.architectures else
                     model.config_class.replace("Config", "ForCausalLM"))(config)
    gen = torch.Generator().manual_seed(MODEL_SEED)
    hidden = config.hidden_size
    tied = bool(getattr(config, "tie_word_embeddings", False))
    with torch.no_grad():
        for name, param in sorted(hf.named_parameters()):
            if name.endswith("norm.weight"):
                std, mean = 0.1, 1.0
            elif name.endswith(".bias"):
                std, mean = 0.1, 0.0
            elif name == "model.embed_tokens.weight":   # doubles as the LM head when tied: logits of a few units
                std, mean = (3.0 * hidden ** -0.5 if tied else 1.0), 0.0
            elif name == "lm_head.weight":
                std, mean = 3.0 * hidden ** -0.5, 0.0
            else:
                std, mean = param.shape[-1] ** -0.5, 0.0
            param.copy_(torch.randn(tuple(param.shape), generator=gen) * std + mean)
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


def requests(block_size: int) -> list[Request]:
    """The fixed requests for an engine whose KV blocks hold `block_size` tokens (prompts drawn on the CPU)."""
    gen = torch.Generator().manual_seed(PROMPT_SEED)

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


def from_json(waves: list[list[dict]]) -> list[Request]:
    return [Request(int(r["id"]), i, tuple(r["prompt"]), int(r["max_tokens"])) for i, w in enumerate(waves) for r in w]
