"""Every declared conformance case of the catalog layers builds and runs for every dtype.

Generic over the layer modules: each case constructs its layer, seeds its parameters, runs
`forward` (the platform's dispatch) and `forward_native`, and is compared with the same layer
run in float64 (what the harness uses as the golden result) within a loose dtype-scaled bound,
so a case whose native result is badly off for some dtype shows up here, not in a vendor run.
"""

from __future__ import annotations

import copy

import pytest
import torch

from reference_impl.custom_op import CustomOp, PluggableLayer
from reference_impl.ir.size_cases import INT32_FLAG, ROWS_FLAG
from reference_impl.layers.cases import LayerCase, LayerCaseError, conformance_of, declare_cases
from reference_impl.layers import (activation, attention, clamped_glu, conv, fused_moe, fused_norm_gate, layernorm,
                                   mamba, minimax_rms_norm, mm_input_norm, nemotron, quantization, rotary_embedding)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MODULES = (activation, clamped_glu, layernorm, fused_norm_gate, nemotron, minimax_rms_norm, mm_input_norm, mamba,
           rotary_embedding, quantization, conv, attention, fused_moe)
# Native in half precision against float64: allowed error in units of the layer's tolerance.
GOLDEN_SLACK = 4.0
# Cases whose half-precision native decides otherwise than float64: GeluAndMulSparse zeroes the gate below
# mean + 1.645 std, a threshold computed in the run dtype; at the op's `large` magnitude (20) 16-bit values near it
# fall on the other side than in float64 (the harness grades these against native, as the IR op's cases are).
THRESHOLD_DECIDES = {("GeluAndMulSparse", "large")}

LAYERS = sorted({cls for module in MODULES for cls in vars(module).values()
                 if isinstance(cls, type) and issubclass(cls, (CustomOp, PluggableLayer))
                 and (cls.__module__ == module.__name__ or cls.__module__.startswith(module.__name__ + "."))
                 and "name" in vars(cls)},  # registered classes (subpackages too), not shared bases (ConvLayerBase)
                key=lambda c: c.__name__)


def _params():
    for cls in LAYERS:
        for case in conformance_of(cls).cases:
            if case.level == "full" and (ROWS_FLAG in case.name or INT32_FLAG in case.name):
                continue   # 1,048,577 rows and past 2^31 elements: the harness's full level runs them, memory allowing
            for dtype in case.dtypes or DTYPES:
                yield pytest.param(cls, case, dtype, id=f"{cls.__name__}::{case.name}::{str(dtype)[6:]}")


def _outputs(value):
    return [v for v in (value if isinstance(value, tuple) else (value,))]


def _golden_inputs(inputs):
    return tuple(a.to(torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point()
                 and a.element_size() > 1 else a for a in inputs)


def test_every_layer_is_registered_and_declares_cases_and_tolerances():
    assert len(LAYERS) >= 18
    for cls in LAYERS:
        assert CustomOp.op_registry.get(cls.name) is cls, cls
        assert conformance_of(cls).cases, f"{cls.__name__} declares no conformance cases"
        names = [c.name for c in conformance_of(cls).cases]
        assert len(names) == len(set(names)), f"{cls.__name__} repeats a case name"
        assert any(c.runs_at("quick") for c in conformance_of(cls).cases), cls
        for dtype in DTYPES:
            atol, rtol = conformance_of(cls).get_tolerance(dtype)
            assert 0 < atol < 1 and 0 < rtol < 1, (cls, dtype)


@pytest.mark.parametrize("cls,case,dtype", list(_params()))
def test_case_runs_and_tracks_float64(cls, case, dtype):
    gen = torch.Generator().manual_seed(2024)
    layer = case.build(cls, dtype)
    if case.init_params is not None:
        case.init_params(layer, gen)
    inputs = case.make_inputs(dtype, "cpu", torch.Generator().manual_seed(7))
    saved = [a.clone() if isinstance(a, torch.Tensor) else a for a in inputs]

    record = conformance_of(cls)   # outputs compared in the form the harness compares them (record.comparable)
    native = _outputs(record.comparable(layer.forward_native(*[a.clone() if isinstance(a, torch.Tensor) else a
                                                                 for a in saved])))
    dispatched = _outputs(record.comparable(layer.forward(*[a.clone() if isinstance(a, torch.Tensor) else a
                                                             for a in saved])))
    golden = _outputs(record.comparable(copy.deepcopy(layer).to(torch.float64).forward_native(*_golden_inputs(saved))))
    atol, rtol = record.get_tolerance(dtype)
    # A mixed-dtype case (a weight pinned to a coarser dtype) rounds through that dtype where the
    # float64 run does not: grade native against float64 at the coarsest dtype's tolerance.
    for p in layer.parameters():
        if p.is_floating_point() and p.dtype in record.tolerances:
            atol, rtol = max(atol, record.get_tolerance(p.dtype)[0]), max(rtol, record.get_tolerance(p.dtype)[1])
    assert len(native) == len(dispatched) == len(golden)
    # Integer outputs are decisions (GroupedTopk's expert ids): half-precision semantics may decide
    # otherwise than the float64 run, and then the values beside them are not comparable either.
    decided_alike = all(out is None or out.is_floating_point() or dtype == torch.float32 or torch.equal(out, gold)
                        for out, gold in zip(native, golden))
    if dtype != torch.float32 and any(cls.__name__ == name and kind in case.name.split(",")
                                      for name, kind in THRESHOLD_DECIDES):
        decided_alike = False
    for out, again, gold in zip(native, dispatched, golden):
        if out is None:
            assert again is None and gold is None
            continue
        assert out.shape == gold.shape and out.dtype == again.dtype
        torch.testing.assert_close(again.double(), out.double(), atol=atol, rtol=rtol, equal_nan=True)
        if decided_alike:
            torch.testing.assert_close(out.double(), gold.double(), atol=GOLDEN_SLACK * atol,
                                       rtol=GOLDEN_SLACK * rtol, equal_nan=True)


# ----- the declaration itself ----------------------------------------------------------------------
def _case(name, level="quick", dtypes=None):
    return LayerCase(name, lambda dtype: {}, lambda dtype, device, gen: (), level=level, dtypes=dtypes)


def _fresh_class():
    return type("Scratch", (), {})


TOL = {torch.float32: (1e-5, 1e-5)}


def test_declaration_is_read_back_and_not_inherited():
    base = _fresh_class()
    record = declare_cases(base, tolerances=TOL, cases=[_case("a"), _case("b", level="standard")])
    assert conformance_of(base) is record
    assert [c.name for c in record.cases] == ["a", "b"]
    assert record.case("b").level == "standard"
    assert record.get_tolerance(torch.float32) == (1e-5, 1e-5)
    sub = type("Sub", (base,), {})
    assert conformance_of(sub) is None, "a subclass must declare its own cases"
    with pytest.raises(LookupError, match="Scratch declares no conformance case 'zzz'"):
        record.case("zzz")
    with pytest.raises(KeyError, match="no tolerance for torch.bfloat16"):
        record.get_tolerance(torch.bfloat16)


@pytest.mark.parametrize("kwargs,match", [
    ({"tolerances": TOL, "cases": [_case("a"), _case("a")]}, "case 'a' declared twice"),
    ({"tolerances": TOL, "cases": []}, "no conformance cases"),
    ({"tolerances": {}, "cases": [_case("a")]}, "no tolerances"),
    ({"tolerances": {torch.float32: (-1.0, 0.0)}, "cases": [_case("a")]}, "atol, rtol >= 0"),
    ({"tolerances": TOL, "cases": [_case("a", dtypes=(torch.float16,))]}, "no tolerance is declared"),
    ({"tolerances": TOL, "cases": [_case("a", level="standard")]}, "no case runs at the quick level"),
    ({"tolerances": TOL, "cases": ["not a case"]}, "str is not a LayerCase"),
])
def test_malformed_declarations_are_refused(kwargs, match):
    with pytest.raises(LayerCaseError, match=match):
        declare_cases(_fresh_class(), **kwargs)


def test_declaring_twice_is_refused():
    cls = _fresh_class()
    declare_cases(cls, tolerances=TOL, cases=[_case("a")])
    with pytest.raises(LayerCaseError, match="Scratch: conformance cases declared twice"):
        declare_cases(cls, tolerances=TOL, cases=[_case("b")])
