"""A transformers `config.json` (Llama, Mistral, Qwen2, Mixtral, Gemma-2, gpt-oss) read into a DecoderConfig, and
written back.

Every key either reaches the model, is known not to change inference (bookkeeping, training-only
settings: `IGNORED`), or refuses the checkpoint with a CheckpointError naming it; nothing falls back
silently. Values follow transformers 5.19's reading of the same file: `rope_parameters` (or the
older `rope_scaling` + top-level `rope_theta`) with each model type's default theta, Qwen2's
`use_sliding_window` / `max_window_layers` / `layer_types`, `dtype` (older `torch_dtype`), and the
defaults of Gemma2Config / GptOssConfig for the keys a config leaves out (`FAMILY_DEFAULTS`).
"""

from __future__ import annotations

from typing import Any

import torch

from reference_impl.models.decoder_config import GATED_ACTIVATIONS, DecoderConfig
from reference_impl.models.rope import ROPE_TYPES, RopeScaling

CONFIG_FILE = "config.json"
MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "gemma2", "gpt_oss")
DEFAULT_THETA = {"llama": 10000.0, "mistral": 10000.0, "qwen2": 10000.0, "mixtral": 1000000.0, "gemma2": 10000.0,
                 "gpt_oss": 150000.0}
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "mixtral": "MixtralForCausalLM", "gemma2": "Gemma2ForCausalLM", "gpt_oss": "GptOssForCausalLM"}
# transformers' class defaults (Gemma2Config, GptOssConfig) for keys a config.json may leave out, where they are
# not ours; gpt-oss without rope keys runs YaRN (GPT_OSS_ROPE), Gemma-2 and gpt-oss alternate windowed layers
FAMILY_DEFAULTS = {
    "gemma2": {"num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 8192, "tie_word_embeddings": True,
               "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256, "sliding_window": 4096,
               "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0},
    "gpt_oss": {"num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                "num_local_experts": 128, "num_experts_per_tok": 4, "sliding_window": 128, "attention_bias": True},
}
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}
# gpt-oss's experts compute the clamped SwiGLU with these constants only (FusedMoE's `swigluoai`)
GPT_OSS_SWIGLU = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# HF config key -> DecoderConfig field: keys every config must have, and plain optional ones
_REQUIRED = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
}
_OPTIONAL = {
    "num_key_value_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "max_position_embeddings": "max_position_embeddings",
    "rms_norm_eps": "rms_norm_eps",
    "tie_word_embeddings": "tie_word_embeddings",
}
_FLOATS = {"rms_norm_eps"}
_BOOLS = {"tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window"}
# keys read by the functions below, per model type (on top of _REQUIRED, _OPTIONAL and _COMMON). `hidden_act` is
# read for the Llama-shaped types; transformers' Gemma-2 reads `hidden_activation` instead and gpt-oss's experts
# always compute the clamped SwiGLU, so there `hidden_act` is accepted and (as in transformers) not used.
_COMMON = {"model_type", "rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor", "hidden_act",
           "dtype", "torch_dtype", "eos_token_id"}
_FAMILY = {
    "llama": {"attention_bias", "mlp_bias"},
    "mistral": {"sliding_window"},
    "mixtral": {"sliding_window", "num_local_experts", "num_experts_per_tok"},
    "qwen2": {"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"},
    "gemma2": {"attention_bias", "sliding_window", "layer_types", "hidden_activation", "query_pre_attn_scalar",
               "attn_logit_softcapping", "final_logit_softcapping", "use_bidirectional_attention"},
    "gpt_oss": {"attention_bias", "sliding_window", "layer_types", "num_local_experts", "num_experts_per_tok",
                *GPT_OSS_SWIGLU},
}
# keys that do not change what the model computes at inference
IGNORED = {
    "architectures", "transformers_version", "_name_or_path", "name_or_path", "initializer_range", "use_cache",
    "attention_dropout", "bos_token_id", "pad_token_id", "pretraining_tp", "output_router_logits",
    "router_aux_loss_coef", "router_jitter_noise", "return_dict", "output_attentions", "output_hidden_states",
    "torchscript", "tokenizer_class", "use_return_dict", "cache_implementation",
}
# rope_parameters keys each rope type reads (rope_type / type and rope_theta are read for all)
_ROPE_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale",
             "mscale_all_dim", "truncate"},
}


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded: missing files, a bad config key, a misshapen tensor."""


def _fail(message: str) -> CheckpointError:
    return CheckpointError(f"{CONFIG_FILE}: {message}")


def _number(key: str, value: Any, *, integer: bool = False, positive: bool = True) -> Any:
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    if not ok or (positive and not value > 0):
        kind = "integer" if integer else "number"
        raise _fail(f"key {key!r} must be a {'positive ' if positive else ''}{kind}, got {value!r}")
    return value if integer else float(value)


def _typed(key: str, value: Any) -> Any:
    if key in _BOOLS:
        if not isinstance(value, bool):
            raise _fail(f"key {key!r} must be true or false, got {value!r}")
        return value
    return _number(key, value, integer=key not in _FLOATS)


def _check_known_keys(doc: dict[str, Any], model_type: str) -> None:
    known = set(_REQUIRED) | set(_OPTIONAL) | _COMMON | _FAMILY[model_type] | IGNORED
    if "quantization_config" in doc:
        raise _fail("key 'quantization_config': quantized checkpoints are not supported")
    unknown = sorted(k for k in doc if k not in known)
    if unknown:
        raise _fail(f"key {unknown[0]!r} is not one the runtime knows for model_type {model_type!r}; it may change "
                    "the model's math, so the checkpoint is refused rather than run without it"
                    + (f" (also unknown: {', '.join(map(repr, unknown[1:]))})" if len(unknown) > 1 else ""))


def _rope(doc: dict[str, Any], model_type: str, max_position: int) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling): `rope_parameters` first (transformers 5), else `rope_scaling`, top-level `rope_theta`."""
    params = doc.get("rope_parameters")
    key = "rope_parameters"
    if params is None:
        params, key = doc.get("rope_scaling"), "rope_scaling"
    if params is None and model_type == "gpt_oss":   # GptOssConfig: YaRN unless the config says otherwise
        params = dict(GPT_OSS_ROPE)
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise _fail(f"key {key!r} must be an object, got {params!r}")
    if any(isinstance(v, dict) for v in params.values()):
        raise _fail(f"key {key!r} holds rope parameters per layer type; the runtime takes one set for all layers")
    partial = params.get("partial_rotary_factor", doc.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise _fail(f"key 'partial_rotary_factor' is {partial!r}; the runtime rotates the whole head (1.0) only")
    theta = params.get("rope_theta", doc.get("rope_theta"))
    theta = DEFAULT_THETA[model_type] if theta is None else _number(f"{key}.rope_theta", theta)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _ROPE_KEYS:
        raise _fail(f"key '{key}.rope_type' is {rope_type!r}; supported: default, {', '.join(ROPE_TYPES)}")
    allowed = _ROPE_KEYS[rope_type] | {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
    extra = sorted(k for k in params if k not in allowed)
    if extra:
        raise _fail(f"key '{key}.{extra[0]}' is not read by rope_type {rope_type!r}; refused rather than ignored")
    if rope_type == "default":
        return theta, None
    fields: dict[str, Any] = {}
    for name in sorted(_ROPE_KEYS[rope_type]):
        value = params.get(name)
        if value is None:
            continue
        if name == "truncate":
            if not isinstance(value, bool):
                raise _fail(f"key '{key}.truncate' must be true or false, got {value!r}")
            fields[name] = value
        elif name == "original_max_position_embeddings":
            fields[name] = _number(f"{key}.{name}", value, integer=True)
        else:
            fields[name] = _number(f"{key}.{name}", value)
    if rope_type in ("llama3", "yarn"):   # transformers: the pretraining length defaults to the current one
        fields.setdefault("original_max_position_embeddings", max_position)
    if "factor" not in fields:
        if rope_type != "yarn":
            raise _fail(f"key '{key}.factor' is missing (rope_type {rope_type!r} needs it)")
        fields["factor"] = max_position / fields["original_max_position_embeddings"]
    if fields["factor"] < 1:
        raise _fail(f"key '{key}.factor' must be >= 1, got {fields['factor']!r}")
    if rope_type == "llama3":
        for name in ("low_freq_factor", "high_freq_factor"):
            if name not in fields:
                raise _fail(f"key '{key}.{name}' is missing (rope_type 'llama3' needs it)")
    return theta, RopeScaling(rope_type, **fields)


def _sliding_window(doc: dict[str, Any], model_type: str, num_layers: int) -> dict[str, Any]:
    """`sliding_window` and `sliding_window_layers` of a DecoderConfig (Mistral, Mixtral: every layer; Qwen2,
    Gemma-2, gpt-oss: the layers `layer_types` names, by default Qwen2's from `max_window_layers` on and the
    others' even layers)."""
    window = doc.get("sliding_window")
    if model_type == "qwen2" and not doc.get("use_sliding_window", False):
        window = None     # transformers' Qwen2 drops the window unless use_sliding_window
    if window is None:
        return {}
    window = _number("sliding_window", window, integer=True)
    if model_type in ("mistral", "mixtral"):
        return {"sliding_window": window}
    layer_types = doc.get("layer_types")
    if layer_types is None:
        if model_type == "qwen2":   # transformers: layers from max_window_layers on slide
            first = _number("max_window_layers", doc.get("max_window_layers", 28), integer=True, positive=False)
            layers = tuple(i for i in range(num_layers) if i >= first)
        else:                       # Gemma2Config / GptOssConfig: layers 0, 2, 4, ... slide
            layers = tuple(range(0, num_layers, 2))
    else:
        if not (isinstance(layer_types, list) and len(layer_types) == num_layers
                and set(layer_types) <= {"full_attention", "sliding_attention"}):
            raise _fail(f"key 'layer_types' must list 'full_attention' or 'sliding_attention' for each of the "
                        f"{num_layers} layers, got {layer_types!r}")
        layers = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
    if not layers:
        return {}
    return {"sliding_window": window, "sliding_window_layers": None if len(layers) == num_layers else layers}


def _optional_positive(doc: dict[str, Any], key: str) -> float | None:
    """A positive number, or None when the key is null."""
    return None if doc.get(key) is None else _number(key, doc[key])


def _gemma2(doc: dict[str, Any], fields: dict[str, Any]) -> None:
    """Gemma-2's fields: its norms, the embedding scale sqrt(hidden_size), the query scale, the two soft caps,
    `hidden_activation`, q/k/v/o biases with `attention_bias`."""
    if doc.get("use_bidirectional_attention"):
        raise _fail("key 'use_bidirectional_attention' is true; the runtime's decoder attends causally only")
    act = doc["hidden_activation"]
    if act not in GATED_ACTIVATIONS:
        raise _fail(f"key 'hidden_activation' is {act!r}; supported: {', '.join(GATED_ACTIVATIONS)}")
    bias = _typed("attention_bias", doc.get("attention_bias", False))
    fields.update(norm_style="gemma2", embedding_scale=fields["hidden_size"] ** 0.5, hidden_act=act,
                  query_pre_attn_scalar=_number("query_pre_attn_scalar", doc["query_pre_attn_scalar"]),
                  attn_logit_softcap=_optional_positive(doc, "attn_logit_softcapping"),
                  final_logit_softcap=_optional_positive(doc, "final_logit_softcapping"),
                  qkv_bias=bias, o_proj_bias=bias)


def _gpt_oss(doc: dict[str, Any], fields: dict[str, Any]) -> None:
    """gpt-oss's fields: its MoE (biased router, top-k then softmax, clamped-SwiGLU experts with biases), attention
    sinks, q/k/v/o biases with `attention_bias`."""
    for key, value in GPT_OSS_SWIGLU.items():
        if doc.get(key, value) != value:
            raise _fail(f"key {key!r} is {doc[key]!r}; the runtime's gpt-oss experts compute the clamped SwiGLU with "
                        f"swiglu_alpha {GPT_OSS_SWIGLU['swiglu_alpha']} and swiglu_limit "
                        f"{GPT_OSS_SWIGLU['swiglu_limit']} only")
    bias = _typed("attention_bias", doc["attention_bias"])
    fields.update(moe_style="gpt_oss", attention_sinks=True, qkv_bias=bias, o_proj_bias=bias,
                  num_experts=_number("num_local_experts", doc["num_local_experts"], integer=True),
                  num_experts_per_tok=_number("num_experts_per_tok", doc["num_experts_per_tok"], integer=True))


def checkpoint_dtype(doc: dict[str, Any]) -> torch.dtype | None:
    """The config's `dtype` (transformers 5) or `torch_dtype`, or None when it names none."""
    values = {k: doc[k] for k in ("dtype", "torch_dtype") if doc.get(k) is not None}
    if len(set(values.values())) > 1:
        raise _fail(f"keys 'dtype' ({values['dtype']!r}) and 'torch_dtype' ({values['torch_dtype']!r}) disagree")
    if not values:
        return None
    key, value = next(iter(values.items()))
    if value not in DTYPES:
        raise _fail(f"key {key!r} is {value!r}; the runtime runs {', '.join(DTYPES)}")
    return DTYPES[value]


def config_from_hf(doc: dict[str, Any]) -> DecoderConfig:
    """A DecoderConfig from `config.json` contents; CheckpointError names the offending key."""
    model_type = doc.get("model_type")
    if model_type not in MODEL_TYPES:
        raise _fail(f"key 'model_type' is {model_type!r}; the reference decoder loads "
                    f"{', '.join(map(repr, MODEL_TYPES))}")
    _check_known_keys(doc, model_type)
    doc = {**FAMILY_DEFAULTS.get(model_type, {}), **doc}
    fields: dict[str, Any] = {}
    for key, field in _REQUIRED.items():
        if key not in doc:
            raise _fail(f"required key {key!r} is missing")
        fields[field] = _typed(key, doc[key])
    for key, field in _OPTIONAL.items():
        if doc.get(key) is not None:
            fields[field] = _typed(key, doc[key])
    if model_type == "mixtral":
        if doc.get("num_local_experts") is None:
            raise _fail("required key 'num_local_experts' is missing (model_type 'mixtral')")
        fields["num_experts"] = _number("num_local_experts", doc["num_local_experts"], integer=True)
        if doc.get("num_experts_per_tok") is not None:
            fields["num_experts_per_tok"] = _number("num_experts_per_tok", doc["num_experts_per_tok"], integer=True)
    fields.setdefault("num_kv_heads", fields["num_heads"])
    if "head_dim" not in fields:
        if fields["hidden_size"] % fields["num_heads"]:
            raise _fail(f"key 'hidden_size' ({fields['hidden_size']}) is not a multiple of 'num_attention_heads' "
                        f"({fields['num_heads']}) and no 'head_dim' is given")
        fields["head_dim"] = fields["hidden_size"] // fields["num_heads"]
    max_position = fields.get("max_position_embeddings", DecoderConfig.max_position_embeddings)
    fields["rope_theta"], fields["rope_scaling"] = _rope(doc, model_type, max_position)
    if model_type not in ("gemma2", "gpt_oss"):
        act = doc.get("hidden_act", "silu")
        if act not in GATED_ACTIVATIONS:
            raise _fail(f"key 'hidden_act' is {act!r}; supported: {', '.join(GATED_ACTIVATIONS)}")
        fields["hidden_act"] = act
    if model_type == "gemma2":
        _gemma2(doc, fields)
    elif model_type == "gpt_oss":
        _gpt_oss(doc, fields)
    elif model_type == "llama":
        bias = _typed("attention_bias", doc.get("attention_bias", False))
        fields.update(qkv_bias=bias, o_proj_bias=bias, mlp_bias=_typed("mlp_bias", doc.get("mlp_bias", False)))
    elif model_type == "qwen2":
        fields["qkv_bias"] = True
    fields.update(_sliding_window(doc, model_type, fields["num_layers"]))
    checkpoint_dtype(doc)
    try:
        return DecoderConfig(**fields)
    except ValueError as exc:
        raise _fail(str(exc)) from None


def _model_type_for(config: DecoderConfig) -> str:
    """The transformers model type that can say everything `config` holds (ValueError when none can)."""
    if config.logit_scale != 1.0:
        raise ValueError(f"config_to_hf: no transformers model type holds logit_scale={config.logit_scale}")
    if config.norm_style == "gemma2":
        _require("gemma2", embedding_scale=config.embedding_scale == config.hidden_size ** 0.5,
                 num_experts=not config.num_experts, mlp_bias=not config.mlp_bias,
                 o_proj_bias=config.qkv_bias == config.o_proj_bias, attention_sinks=not config.attention_sinks)
        return "gemma2"
    if config.moe_style == "gpt_oss" or config.attention_sinks:
        _require("gpt_oss", num_experts=bool(config.num_experts), moe_style=config.moe_style == "gpt_oss",
                 attention_sinks=config.attention_sinks, mlp_bias=not config.mlp_bias,
                 o_proj_bias=config.qkv_bias == config.o_proj_bias, embedding_scale=config.embedding_scale == 1.0,
                 query_pre_attn_scalar=config.query_pre_attn_scalar is None,
                 attn_logit_softcap=config.attn_logit_softcap is None,
                 final_logit_softcap=config.final_logit_softcap is None,
                 hidden_act=config.hidden_act == "silu")   # unused by its experts; "silu" is what the reader gives
        return "gpt_oss"
    gemma_only = [name for name, value in (("embedding_scale", config.embedding_scale != 1.0),
                                           ("query_pre_attn_scalar", config.query_pre_attn_scalar is not None),
                                           ("attn_logit_softcap", config.attn_logit_softcap is not None),
                                           ("final_logit_softcap", config.final_logit_softcap is not None)) if value]
    if gemma_only:
        raise ValueError(f"config_to_hf: {', '.join(gemma_only)} is Gemma-2's (norm_style 'gemma2') only")
    biased = config.qkv_bias or config.o_proj_bias or config.mlp_bias
    if config.qkv_bias and not (config.o_proj_bias or config.mlp_bias or config.num_experts):
        return "qwen2"
    if config.sliding_window_layers is not None:
        raise ValueError("config_to_hf: a window on some layers only is Qwen2's, which has q/k/v biases")
    if config.num_experts and not biased:
        return "mixtral"
    if config.sliding_window is not None and not biased:
        return "mistral"
    if config.sliding_window is None and not config.num_experts and config.qkv_bias == config.o_proj_bias:
        return "llama"
    raise ValueError(f"config_to_hf: no transformers model type holds this config (experts {config.num_experts}, "
                     f"window {config.sliding_window}, biases qkv {config.qkv_bias} o_proj {config.o_proj_bias} "
                     f"mlp {config.mlp_bias})")


def _require(model_type: str, **conditions: bool) -> None:
    """ValueError naming the first DecoderConfig field `model_type`'s config.json cannot say."""
    failed = [name for name, ok in conditions.items() if not ok]
    if failed:
        raise ValueError(f"config_to_hf: a {model_type} config.json cannot hold this config's {failed[0]}")


def config_to_hf(config: DecoderConfig, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """The `config.json` contents for `config`: Gemma-2 for Gemma's norms, gpt-oss for its MoE and sinks, Mixtral
    with experts, Qwen2 for q/k/v-only biases, Mistral for a window, Llama otherwise (ValueError for a config
    none of them can say)."""
    model_type = _model_type_for(config)
    doc: dict[str, Any] = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "dtype": str(dtype).removeprefix("torch."),
    }
    for key, field in {**_REQUIRED, **_OPTIONAL}.items():
        doc[key] = getattr(config, field)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling is not None:
        s = config.rope_scaling
        rope["rope_type"] = s.rope_type
        for name in _ROPE_KEYS[s.rope_type]:
            if getattr(s, name) is not None:
                rope[name] = getattr(s, name)
    doc["rope_parameters"] = rope
    if model_type == "gemma2":
        doc["hidden_activation"] = config.hidden_act
    elif model_type != "gpt_oss":
        doc["hidden_act"] = config.hidden_act
    if model_type in ("mixtral", "gpt_oss"):
        doc.update(num_local_experts=config.num_experts, num_experts_per_tok=config.num_experts_per_tok)
    if model_type == "llama":
        doc.update(attention_bias=config.qkv_bias, mlp_bias=config.mlp_bias)
    if model_type in ("gemma2", "gpt_oss"):
        doc["attention_bias"] = config.qkv_bias
    if model_type == "gemma2":
        doc.update(query_pre_attn_scalar=(config.query_pre_attn_scalar if config.query_pre_attn_scalar is not None
                                          else config.head_dim),
                   attn_logit_softcapping=config.attn_logit_softcap,
                   final_logit_softcapping=config.final_logit_softcap)
    if model_type == "gpt_oss":
        doc.update(GPT_OSS_SWIGLU)
    layer_types = ["sliding_attention" if config.attention_window(i) else "full_attention"
                   for i in range(config.num_layers)]
    if model_type == "qwen2":
        doc.update(use_sliding_window=config.sliding_window is not None, sliding_window=config.sliding_window,
                   layer_types=layer_types)
    elif model_type in ("gemma2", "gpt_oss"):
        doc.update(sliding_window=config.sliding_window, layer_types=layer_types)
    elif model_type in ("mistral", "mixtral"):
        doc["sliding_window"] = config.sliding_window
    return doc
