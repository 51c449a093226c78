"""Layers that compute an IR op inherit every case kind the op declares (reference_impl.layers.cases.from_op_cases):
the layer's record holds each of the op's cases (the size cases too, with their memory need) with its level, dtypes
and beyond-vLLM reason, and each derived case calls the layer with what the op case calls the op with."""

from __future__ import annotations

import types

import pytest
import torch

from conformance.checks.common import native_only
from conformance.collect.inventory import import_catalog
from reference_impl import ir
from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import OpCase
from reference_impl.layers.cases import LayerCaseError, conformance_of, declare_cases, from_op_cases
from reference_impl.platforms import CpuPlatform, activate_platform

import_catalog()

# layer -> [(op, layer case name of an op case name)]
DERIVED = {
    "quant_fp8": [("static_quant_fp8", "static,{}"), ("dynamic_quant_fp8", "dynamic,{}"),
                  ("dynamic_group_quant_fp8", "dynamic,{}")],
    "rms_norm": [("rms_norm", "{}"), ("fused_add_rms_norm", "{},residual")],
    "rotary_embedding": [("rotary_embedding", "{}"), ("rotary_embedding_query", "{},key=None")],
    **{name: [(name, "{}")] for name in ("silu_and_mul", "mul_and_silu", "gelu_and_mul", "gelu_and_mul_sparse",
                                          "gelu_new", "gelu_fast", "quick_gelu", "relu2", "swigluoai_and_mul",
                                          "fatrelu_and_mul")},
}


@pytest.mark.parametrize("layer", sorted(DERIVED))
def test_every_case_of_the_op_is_a_case_of_the_layer_with_its_level_dtypes_and_reason(layer):
    cases = {c.name: c for c in conformance_of(CustomOp.op_registry[layer]).cases}
    for op_name, pattern in DERIVED[layer]:
        op_cases = ir.ops.__getattr__(op_name).cases
        assert op_cases and [c for c in op_cases if c.numerics_only]   # the size cases are among them
        for op_case in op_cases:
            case = cases[pattern.format(op_case.name)]
            # a layer's judgement is in one piece: its memory need is the op case's whole one (size_cases)
            assert (case.level, case.dtypes, case.beyond_vllm, case.memory_bytes) == \
                (op_case.level, op_case.dtypes, op_case.beyond_vllm, op_case.whole_memory_bytes or op_case.memory_bytes)


def test_the_saturated_static_cases_reach_quantfp8():
    names = {c.name for c in conformance_of(CustomOp.op_registry["quant_fp8"]).cases}
    assert {f"static,tokens=4,hidden=256,saturated,{k}" for k in ("per_tensor", "per_token", "per_group")} <= names


def _same(a, b):
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        torch.testing.assert_close(x.float(), y.float(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("layer, op_name, pattern, case_name, call", [
    ("quant_fp8", "static_quant_fp8", "static,{}", "tokens=4,hidden=256,saturated,per_group", lambda out: out[0]),
    ("quant_fp8", "dynamic_quant_fp8", "dynamic,{}", "tokens=7,hidden=768,per_token,scale_ub", None),
    ("quant_fp8", "dynamic_group_quant_fp8", "dynamic,{}", "tokens=4,hidden=200,ragged,group=128", None),
    ("rms_norm", "fused_add_rms_norm", "{},residual", "tokens=7,hidden=769,weight=float32", None),
    ("gelu_and_mul", "gelu_and_mul", "{}", "tokens=7,d=769,approximate=tanh", None),
    ("fatrelu_and_mul", "fatrelu_and_mul", "{}", "tokens=7,d=769,threshold=0.5", None),
    ("rotary_embedding", "rotary_embedding", "{}", "tokens=5,heads=4/2,head=80,rot=32,gptj,cache=float32", None),
    ("rotary_embedding", "rotary_embedding_query", "{},key=None", "tokens=6,heads=2/2,head=64,3d,neox",
     lambda out: out[0]),
])
def test_a_derived_case_calls_the_layer_with_what_the_op_case_calls_the_op_with(layer, op_name, pattern, case_name,
                                                                                call):
    op = ir.ops.__getattr__(op_name)
    cls = CustomOp.op_registry[layer]
    case = conformance_of(cls).case(pattern.format(case_name))
    [op_case] = [c for c in op.cases if c.name == case_name]
    dtype = (op_case.dtypes or (torch.float16,))[0]
    args = op_case.make_args(dtype, "cpu", torch.Generator().manual_seed(5))
    inputs = case.make_inputs(dtype, "cpu", torch.Generator().manual_seed(5))
    with activate_platform(CpuPlatform()):
        built = case.build(cls, dtype)
        if hasattr(built, "weight") and len(args) == 5:   # the norm: the op case's weight, of its dtype
            assert built.weight.dtype == args[2].dtype
            built.weight.data.copy_(args[2])
        if hasattr(built, "cos_sin_cache"):   # rotary: the layer builds the op case's cache (base, size, dtype)
            assert torch.equal(built.cos_sin_cache, args[-2])
        with native_only():   # the layer's IR calls on their native semantics, as the op's native
            out = built.forward_native(*inputs)
        expected = op.impls["native"].impl_fn(*args)
    _same(call(out) if call else out, expected)


def test_size_cases_carry_their_memory_need_and_unselected_op_cases_are_left_to_the_op():
    def args(dtype, device, gen):
        return (torch.zeros(2, 4, dtype=dtype),)

    fake = types.SimpleNamespace(cases=[OpCase("plain", args), OpCase("other", args, level="standard"),
                                        OpCase("huge", args, level="full", memory_bytes=1 << 33, numerics_only=True),
                                        OpCase("rows", args, level="standard", numerics_only=True)])
    derived = from_op_cases(fake, lambda a: ({"hidden": a[0].shape[-1]}, a), keep=lambda c: c.name != "other")
    assert [(c.name, c.level, c.memory_bytes) for c in derived] == [
        ("plain", "quick", None), ("huge", "full", 1 << 33), ("rows", "standard", None)]
    assert derived[0].make_kwargs(torch.float32) == {"hidden": 4}


def test_a_derived_name_that_collides_is_refused_by_the_declaration():
    def args(dtype, device, gen):
        return (torch.zeros(1, 2, dtype=dtype),)

    fake = types.SimpleNamespace(cases=[OpCase("a", args), OpCase("b", args)])

    class Layer:
        pass

    with pytest.raises(LayerCaseError, match="case 'same' declared twice"):
        declare_cases(Layer, tolerances={torch.float32: (0.0, 0.0)},
                      cases=from_op_cases(fake, lambda a: ({}, a), name=lambda n: "same"))


def test_a_size_case_past_int32_lists_its_constructor_kwargs_without_allocating_its_inputs():
    """RMSNorm's case past 2^31 elements gives the kwargs of the 4,097-row case (8 wide) from fake tensors: a check
    that only constructs the layer (or a test listing kwargs) does not allocate its 4 GiB of inputs."""
    import resource

    cases = conformance_of(CustomOp.op_registry["rms_norm"]).cases
    [big] = [c for c in cases if "elements_past_int32" in c.name and "residual" not in c.name]
    [small] = [c for c in cases if c.name.startswith("tokens=4097,") and "residual" not in c.name]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kwargs = big.make_kwargs(torch.bfloat16)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert kwargs == small.make_kwargs(torch.bfloat16)
    assert grown_kib < (1 << 20), f"peak memory grew by {grown_kib} KiB"   # far below the 4 GiB of inputs
