"""Hugging Face-style checkpoint directories: `config.json` + `model.safetensors` (or shards listed by
`model.safetensors.index.json`), Llama / Mistral / Qwen2 / Mixtral / Gemma-2 / gpt-oss names.

`save_checkpoint` writes one (`write_random_checkpoint`: seeded random weights, for tests and demos);
`load_checkpoint` reads one into the reference decoder on this rank: the config is read key by key
(models/hf_config.py: honoured or refused, never ignored), every tensor's shape is checked against
it (the error names the tensor) and the tensor-parallel layers keep only this rank's shard (`--tp N`
on torch.distributed). The config's `dtype` is the default dtype. Only local files are read:
nothing is ever downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from reference_impl.layers.cpu_gemm import pack_cpu_gemms
from reference_impl.models.hf_config import (  # noqa: F401 - CheckpointError and config_from_hf re-exported
    CONFIG_FILE,
    CheckpointError,
    checkpoint_dtype,
    config_from_hf,
    config_to_hf,
)
from reference_impl.models.decoder_config import DecoderConfig
from reference_impl.models.llama import LlamaForCausalLM, build_model
from reference_impl.models.weights import random_checkpoint

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


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


def read_config_json(directory: str | Path) -> dict[str, Any]:
    """The parsed `config.json` of a checkpoint directory (CheckpointError when missing or not a JSON object)."""
    path = _existing(directory) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint directory {directory} has no {CONFIG_FILE}")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return doc


def read_config(directory: str | Path) -> DecoderConfig:
    return config_from_hf(read_config_json(directory))


def read_dtype(directory: str | Path) -> torch.dtype:
    """The checkpoint's default dtype: its config's `dtype` / `torch_dtype`, float32 when it names none."""
    return checkpoint_dtype(read_config_json(directory)) or torch.float32


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


def _read_file(path: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path), device="cpu")
    except SafetensorError as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    return {k: v.to(dtype) for k, v in tensors.items()}


def _read_sharded(directory: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors of every shard the index's `weight_map` names, each found in the shard it names."""
    index_path = directory / INDEX_FILE
    try:
        weight_map = json.loads(index_path.read_text()).get("weight_map")
    except (json.JSONDecodeError, AttributeError):
        weight_map = None
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(f, str) and "/" not in f and "\\" not in f for f in weight_map.values()):
        raise CheckpointError(f"{index_path}: expected a JSON object whose 'weight_map' maps tensor names to "
                              "shard file names in the same directory")
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        path = directory / shard
        if not path.is_file():
            raise CheckpointError(f"{index_path}: shard {shard} is missing from {directory}")
        got = _read_file(path, dtype)
        for name in got:
            if weight_map.get(name) != shard:
                raise CheckpointError(f"{path}: tensor {name} is not listed for this shard in {INDEX_FILE}")
        tensors.update(got)
    absent = sorted(set(weight_map) - set(tensors))
    if absent:
        raise CheckpointError(f"{index_path}: tensor {absent[0]} is listed but not in shard {weight_map[absent[0]]}")
    return tensors


def read_tensors(directory: str | Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor of `model.safetensors`, or of the shards `model.safetensors.index.json` lists, cast to
    `dtype` (on the CPU)."""
    directory = _existing(directory)
    if (directory / WEIGHTS_FILE).is_file():
        return _read_file(directory / WEIGHTS_FILE, dtype)
    if (directory / INDEX_FILE).is_file():
        return _read_sharded(directory, dtype)
    others = sorted(p.name for p in directory.glob("*.bin")) + sorted(p.name for p in directory.glob("*.pt"))
    hint = f" (found {', '.join(others)}: only safetensors files are read)" if others else ""
    raise CheckpointError(f"checkpoint directory {directory} has no {WEIGHTS_FILE} or {INDEX_FILE}{hint}")


def load_checkpoint(directory: str | Path, dtype: torch.dtype | None = None, device: torch.device | str = "cpu",
                    *, cpu_gemm: bool = True, attn_backend: type | str | None = None) -> LlamaForCausalLM:
    """The decoder of a checkpoint directory, this rank's shards, on `device` (CheckpointError on problems).

    `dtype` None: the config's `dtype` (float32 when it names none). On the CPU the projections and the
    LM head run prepacked oneDNN GEMMs (layers/cpu_gemm.py) unless `cpu_gemm=False`. `attn_backend` (a
    backend class or registry name) overrides the platform's choice of attention backend.
    """
    config = read_config(directory)
    dtype = dtype if dtype is not None else read_dtype(directory)
    tensors = read_tensors(directory, dtype)
    try:
        model = build_model(config, dtype, checkpoint=tensors, device=device, attn_backend=attn_backend)
    except (KeyError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise CheckpointError(f"{Path(directory)}: {message}") from None
    if cpu_gemm:
        pack_cpu_gemms(model)
    return model
