"""Tiny checkpoints written by transformers' `save_pretrained` (seeded random weights) for each config field
the runtime honours, and their comparison with transformers on the same token ids
(tests/runtime/test_runtime_checkpoints.py). Run as a script to print the fidelity table:

    .venv/bin/python tests/support/_hf_checkpoints.py
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from conformance.checks.engine.models import randomize_weights

BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128)
PROMPT_LEN, NEW_TOKENS = 24, 8
PROMPTS_SEED = 5


@dataclasses.dataclass(frozen=True)
class Case:
    """`model_type` with config kwargs on top of BASE; `edit` rewrites the saved config.json (older layouts);
    `save` goes to save_pretrained; `ignoring` are the DecoderConfig values a runtime that ignored the
    field would run with (to show the comparison would catch it); `ignoring_each` names several such sets,
    each tried alone. `attn_implementation` is transformers' (None: its default)."""

    model_type: str
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    edit: Callable[[dict], None] | None = None
    save: dict[str, Any] = dataclasses.field(default_factory=dict)
    ignoring: dict[str, Any] | None = None
    ignoring_each: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    attn_implementation: str | None = None


def _legacy_rope(theta: float, scaling: dict | None) -> Callable[[dict], None]:
    """config.json as transformers 4 wrote it: top-level rope_theta, rope_scaling, no rope_parameters."""
    def edit(doc: dict) -> None:
        doc.pop("rope_parameters", None)
        doc["rope_theta"] = theta
        doc["rope_scaling"] = scaling
    return edit


def _drop_rope(doc: dict) -> None:
    doc.pop("rope_parameters", None)


NO_SCALING = {"rope_scaling": None}
NO_WINDOW = {"sliding_window": None, "sliding_window_layers": None}
# Gemma-2 and gpt-oss: head_dim 32 (q/k/v of 128 against hidden 64), a window of 8 on layer 0 (the default
# layer_types alternate, sliding first) under a 24-token prompt, soft caps small enough to bend the scores;
# Gemma-2 untied (tied, its random embedding makes every position predict its own token)
GEMMA2 = dict(head_dim=32, query_pre_attn_scalar=24, attn_logit_softcapping=3.0, final_logit_softcapping=4.0,
              sliding_window=8, tie_word_embeddings=False)
GPT_OSS = dict(head_dim=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
               rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                                "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 32})
CASES = {
    "llama": Case("llama"),
    "rope_parameters theta 1e6": Case("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
                                      ignoring={"rope_theta": 1e4}),
    "top-level rope_theta 5e5 (transformers 4)": Case("llama", edit=_legacy_rope(5e5, None),
                                                      ignoring={"rope_theta": 1e4}),
    "rope llama3": Case("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 16}}, ignoring=NO_SCALING),
    "rope linear": Case("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}},
                        ignoring=NO_SCALING),
    "rope dynamic": Case("llama", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}},
                         ignoring=NO_SCALING),
    "rope yarn": Case("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                                    "original_max_position_embeddings": 32}}, ignoring=NO_SCALING),
    "rope yarn beta/attention_factor": Case("llama", {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0, "original_max_position_embeddings": 16,
        "beta_fast": 16.0, "beta_slow": 2.0, "attention_factor": 1.3, "truncate": False}}, ignoring=NO_SCALING),
    "rope_scaling linear (transformers 4)": Case("llama", edit=_legacy_rope(1e5, {"type": "linear", "factor": 2.0}),
                                                 ignoring={"rope_scaling": None, "rope_theta": 1e4}),
    "hidden_act gelu": Case("llama", {"hidden_act": "gelu"}, ignoring={"hidden_act": "silu"}),
    "hidden_act gelu_pytorch_tanh": Case("llama", {"hidden_act": "gelu_pytorch_tanh"}, ignoring={"hidden_act": "silu"}),
    "attention_bias + mlp_bias": Case("llama", {"attention_bias": True, "mlp_bias": True},
                                      ignoring={"qkv_bias": False, "o_proj_bias": False, "mlp_bias": False}),
    "tie_word_embeddings": Case("llama", {"tie_word_embeddings": True}),
    "head_dim 24 (hidden/heads 16)": Case("llama", {"head_dim": 24}),
    "dtype bfloat16": Case("llama", {"dtype": "bfloat16"}),
    "sharded index": Case("llama", save={"max_shard_size": "100KB"}),
    "qwen2 (q/k/v biases)": Case("qwen2", ignoring={"qkv_bias": False}),
    "qwen2 sliding window 8 on layer 1": Case("qwen2", {"use_sliding_window": True, "sliding_window": 8,
                                                        "max_window_layers": 1}, ignoring=NO_WINDOW),
    "mistral sliding window 8": Case("mistral", {"sliding_window": 8}, ignoring=NO_WINDOW),
    "mixtral": Case("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}, ignoring={"rope_theta": 1e4}),
    "mixtral default theta, no rope keys": Case("mixtral", {"num_local_experts": 4}, edit=_drop_rope,
                                                ignoring={"rope_theta": 1e4}),
    # transformers' default attention for Gemma-2 is SDPA, which drops the attention soft cap: compare with eager
    "gemma2": Case("gemma2", GEMMA2, attn_implementation="eager", ignoring_each={
        "embedding scale": {"embedding_scale": 1.0}, "attention soft cap": {"attn_logit_softcap": None},
        "final soft cap": {"final_logit_softcap": None}, "query_pre_attn_scalar": {"query_pre_attn_scalar": None},
        "window": NO_WINDOW, "Gemma norms": {"norm_style": "llama"}}),
    "gemma2 attention_bias, no soft caps, full attention": Case("gemma2", {
        **GEMMA2, "attention_bias": True, "attn_logit_softcapping": None, "final_logit_softcapping": None,
        "layer_types": ["full_attention"] * 2, "tie_word_embeddings": True}, attn_implementation="eager",
        ignoring={"qkv_bias": False, "o_proj_bias": False}),
    "gpt_oss": Case("gpt_oss", GPT_OSS, ignoring_each={
        "sinks": {"attention_sinks": False}, "window": NO_WINDOW, "yarn": NO_SCALING}),
    "gpt_oss default YaRN (no rope keys), no attention_bias": Case(
        "gpt_oss", {**GPT_OSS, "attention_bias": False}, edit=_drop_rope, ignoring=NO_SCALING),
}


def _classes(model_type: str):
    import transformers

    name = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "mixtral": "Mixtral", "gemma2": "Gemma2",
            "gpt_oss": "GptOss"}[model_type]
    return getattr(transformers, f"{name}Config"), getattr(transformers, f"{name}ForCausalLM")


def write_case(case: Case, directory: Path, seed: int = 0) -> Path:
    """Save a seeded random transformers model of `case` under `directory` (float32 weights unless its dtype)."""
    config_cls, model_cls = _classes(case.model_type)
    config = config_cls(**{**BASE, **case.kwargs})
    torch.manual_seed(seed)
    model = model_cls(config).float()
    randomize_weights(model, seed)
    if case.kwargs.get("dtype") is not None:
        model = model.to(getattr(torch, case.kwargs["dtype"]))
    model.save_pretrained(directory, **case.save)
    if case.edit is not None:
        path = directory / "config.json"
        doc = json.loads(path.read_text())
        case.edit(doc)
        path.write_text(json.dumps(doc, indent=2))
    return directory


def prompt_ids(vocab: int = BASE["vocab_size"]) -> list[int]:
    return torch.randint(0, vocab, (PROMPT_LEN,), generator=torch.Generator().manual_seed(PROMPTS_SEED)).tolist()


def hf_model(directory: Path, dtype: torch.dtype = torch.float32, attn_implementation: str | None = None):
    from transformers import AutoModelForCausalLM

    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, **extra).eval()
    model.generation_config.eos_token_id = None   # as our generate without stop tokens
    model.generation_config.pad_token_id = 0
    return model


def hf_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy `generate` (its own KV cache)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, attention_mask=torch.ones_like(ids))
    return out[0, len(prompt):].tolist()


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0].float()


@dataclasses.dataclass
class Comparison:
    """Ours vs transformers on one prompt: max |logit diff| over prompt + generated positions, recomputed
    (no cache) and through the KV cache; greedy tokens of each."""

    recompute_diff: float
    cache_diff: float
    hf_tokens: list[int]
    cache_tokens: list[int]
    recompute_tokens: list[int]
    ignored_diff: float | None = None
    ignored_each: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def tokens_equal(self) -> bool:
        return self.hf_tokens == self.cache_tokens == self.recompute_tokens


def compare(directory: Path, dtype: torch.dtype | None = None, ignoring: dict[str, Any] | None = None,
            ignoring_each: dict[str, dict[str, Any]] | None = None,
            attn_implementation: str | None = None) -> Comparison:
    """Load `directory` with the runtime (its config's dtype unless `dtype`) and with transformers (same dtype,
    `attn_implementation`); `ignoring`: also the max logit diff of a runtime that ran the config with these
    values instead; `ignoring_each`: the same for each named set of values."""
    from reference_impl.models import generate, greedy_generate
    from reference_impl.models.checkpoint import load_checkpoint

    ours = load_checkpoint(directory, dtype)
    theirs = hf_model(directory, ours.dtype, attn_implementation)
    prompt = prompt_ids()
    hf_tokens = hf_greedy(theirs, prompt, NEW_TOKENS)
    ids = prompt + hf_tokens[:-1]
    want = hf_logits(theirs, ids)
    with torch.no_grad():
        recomputed = ours(torch.tensor(ids), torch.arange(len(ids))).float()
    cached = generate(ours, [prompt], NEW_TOKENS, cache=ours.allocate_kv_cache(1, len(ids) + 1), prompt_logits=True)
    recompute_tokens = greedy_generate(ours, torch.tensor(prompt), NEW_TOKENS).tokens
    rows = len(prompt) + min(_common_prefix(cached.tokens[0], hf_tokens), NEW_TOKENS - 1)
    ignored_diff = None if ignoring is None else _ignored_diff(directory, ours, ignoring, ids, want)
    ignored_each = {label: _ignored_diff(directory, ours, values, ids, want)
                    for label, values in (ignoring_each or {}).items()}
    return Comparison((recomputed - want).abs().max().item(),
                      (cached.sequence_logits(0)[:rows].float() - want[:rows]).abs().max().item(),
                      hf_tokens, cached.tokens[0], recompute_tokens, ignored_diff, ignored_each)


def _ignored_diff(directory: Path, ours, values: dict[str, Any], ids: list[int], want: torch.Tensor) -> float:
    """Max |logit diff| from transformers' `want` of a runtime that ran the checkpoint's config with `values`
    instead (the checkpoint's tensors that config has no place for left out)."""
    from reference_impl.models import build_model, expected_shapes
    from reference_impl.models.checkpoint import read_tensors

    config = dataclasses.replace(ours.config, **values)
    tensors = {k: v for k, v in read_tensors(directory, ours.dtype).items() if k in expected_shapes(config)}
    with torch.no_grad():
        naive = build_model(config, ours.dtype, checkpoint=tensors)(torch.tensor(ids), torch.arange(len(ids)))
    return (naive.float() - want).abs().max().item()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main() -> None:
    import tempfile

    print(f"| config | max logit diff, no cache | max logit diff, KV cache | tokens equal ({NEW_TOKENS}) | "
          "diff if the field were ignored |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, case) in enumerate(CASES.items()):
            directory = write_case(case, Path(tmp) / str(i), seed=i)
            got = compare(directory, ignoring=case.ignoring, ignoring_each=case.ignoring_each,
                          attn_implementation=case.attn_implementation)
            ignored = "" if got.ignored_diff is None else f"{got.ignored_diff:.2g}"
            ignored = ", ".join([ignored] * bool(ignored) + [f"{k} {v:.2g}" for k, v in got.ignored_each.items()])
            print(f"| {name} | {got.recompute_diff:.1e} | {got.cache_diff:.1e} | "
                  f"{'yes' if got.tokens_equal else 'NO'} | {ignored} |", flush=True)


if __name__ == "__main__":
    main()
