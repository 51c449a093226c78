"""Hugging Face-style checkpoint directories: `config.json` + `model.safetensors`, Llama / Mixtral names.

`save_checkpoint` writes one (`write_random_checkpoint`: seeded random weights, for tests and demos);
`load_checkpoint` reads one into the reference decoder on this rank: every tensor's shape is checked
against the config (the error names the tensor) and the tensor-parallel layers keep only this rank's
shard (`--tp N` on torch.distributed). Only local files are read: nothing is ever downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from reference_impl.models.llama import DecoderConfig, LlamaForCausalLM, build_model, random_checkpoint

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
DENSE_TYPE, MOE_TYPE = "llama", "mixtral"

# HF config key -> DecoderConfig field, for keys every config must have
_REQUIRED = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
}
# optional keys; absent ones take DecoderConfig's default (num_key_value_heads: num_attention_heads)
_OPTIONAL = {
    "num_key_value_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "rope_theta": "rope_theta",
    "max_position_embeddings": "max_position_embeddings",
    "rms_norm_eps": "rms_norm_eps",
    "tie_word_embeddings": "tie_word_embeddings",
    "num_local_experts": "num_experts",
    "num_experts_per_tok": "num_experts_per_tok",
}
_FLOATS = {"rope_theta", "rms_norm_eps"}
_BOOLS = {"tie_word_embeddings"}


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded: missing files, a bad config key, a misshapen tensor."""


def config_to_hf(config: DecoderConfig, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """The `config.json` contents for `config` (Llama, or Mixtral when it has experts)."""
    moe = config.num_experts > 0
    doc: dict[str, Any] = {
        "architectures": ["MixtralForCausalLM" if moe else "LlamaForCausalLM"],
        "model_type": MOE_TYPE if moe else DENSE_TYPE,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    for key, field in {**_REQUIRED, **_OPTIONAL}.items():
        if key in ("num_local_experts", "num_experts_per_tok") and not moe:
            continue
        doc[key] = getattr(config, field)
    return doc


def _typed(key: str, value: Any) -> Any:
    if key in _BOOLS:
        if not isinstance(value, bool):
            raise CheckpointError(f"{CONFIG_FILE}: key {key!r} must be true or false, got {value!r}")
        return value
    if key in _FLOATS:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise CheckpointError(f"{CONFIG_FILE}: key {key!r} must be a positive number, got {value!r}")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"{CONFIG_FILE}: key {key!r} must be a positive integer, got {value!r}")
    return value


def config_from_hf(doc: dict[str, Any]) -> DecoderConfig:
    """A DecoderConfig from `config.json` contents; CheckpointError names the offending key."""
    model_type = doc.get("model_type")
    if model_type not in (DENSE_TYPE, MOE_TYPE):
        raise CheckpointError(f"{CONFIG_FILE}: key 'model_type' is {model_type!r}; the reference decoder loads "
                              f"{DENSE_TYPE!r} and {MOE_TYPE!r}")
    fields: dict[str, Any] = {}
    for key, field in _REQUIRED.items():
        if key not in doc:
            raise CheckpointError(f"{CONFIG_FILE}: required key {key!r} is missing")
        fields[field] = _typed(key, doc[key])
    for key, field in _OPTIONAL.items():
        if doc.get(key) is not None:
            fields[field] = _typed(key, doc[key])
    if model_type == MOE_TYPE and "num_experts" not in fields:
        raise CheckpointError(f"{CONFIG_FILE}: required key 'num_local_experts' is missing (model_type "
                              f"{MOE_TYPE!r})")
    if model_type == DENSE_TYPE:
        fields.pop("num_experts", None)
    fields.setdefault("num_kv_heads", fields["num_heads"])
    if "head_dim" not in fields:
        if fields["hidden_size"] % fields["num_heads"]:
            raise CheckpointError(f"{CONFIG_FILE}: key 'hidden_size' ({fields['hidden_size']}) is not a multiple "
                                  f"of 'num_attention_heads' ({fields['num_heads']}) and no 'head_dim' is given")
        fields["head_dim"] = fields["hidden_size"] // fields["num_heads"]
    try:
        return DecoderConfig(**fields)
    except ValueError as exc:
        raise CheckpointError(f"{CONFIG_FILE}: {exc}") from None


def save_checkpoint(directory: str | Path, config: DecoderConfig, tensors: dict[str, torch.Tensor],
                    dtype: torch.dtype = torch.float32) -> Path:
    """Write `config.json` and `model.safetensors` (tensors cast to `dtype`) under `directory`."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_FILE).write_text(json.dumps(config_to_hf(config, dtype), indent=2) + "\n")
    save_file({k: v.detach().to("cpu", dtype).contiguous() for k, v in tensors.items()},
              str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    return directory


def write_random_checkpoint(directory: str | Path, config: DecoderConfig, seed: int = 0,
                            dtype: torch.dtype = torch.float32) -> Path:
    """A checkpoint directory with `random_checkpoint(config, seed)` weights."""
    return save_checkpoint(directory, config, random_checkpoint(config, seed, torch.float32), dtype)


def read_config(directory: str | Path) -> DecoderConfig:
    path = _existing(directory) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint directory {directory} has no {CONFIG_FILE}")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return config_from_hf(doc)


def read_eos_token_ids(directory: str | Path) -> list[int]:
    """`eos_token_id` of a checkpoint's config.json (an id, a list of ids, or absent / null: none)."""
    path = _existing(directory) / CONFIG_FILE
    try:
        value = json.loads(path.read_text()).get("eos_token_id")
    except (OSError, json.JSONDecodeError, AttributeError):
        return []          # read_config, called first, names what is wrong with the file
    ids = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if ids is None:
        return []
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise CheckpointError(f"{path}: key 'eos_token_id' must be a non-negative integer or a list of them, "
                              f"got {value!r}")
    return ids


def _existing(directory: str | Path) -> Path:
    path = Path(directory)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist (only local directories are "
                              "read; nothing is downloaded)")
    return path


def read_tensors(directory: str | Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor of `model.safetensors`, cast to `dtype` (on the CPU)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = _existing(directory) / WEIGHTS_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint directory {directory} has no {WEIGHTS_FILE}")
    try:
        tensors = load_file(str(path), device="cpu")
    except SafetensorError as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    return {k: v.to(dtype) for k, v in tensors.items()}


def load_checkpoint(directory: str | Path, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu") -> LlamaForCausalLM:
    """The decoder of a checkpoint directory, this rank's shards, on `device` (CheckpointError on problems)."""
    config = read_config(directory)
    tensors = read_tensors(directory, dtype)
    try:
        return build_model(config, dtype, checkpoint=tensors, device=device)
    except (KeyError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise CheckpointError(f"{Path(directory) / WEIGHTS_FILE}: {message}") from None
