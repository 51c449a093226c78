"""`compile_module`: a module of CustomOp layers compiled under a RuntimeConfig.

Custom ops are off by default with inductor (the spec's rule) and dispatch as in eager when
enabled; the module's config (IR priorities) is the one the lowering sees; each compilation mode
takes its own path.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from reference_impl import ir
from reference_impl.compilation import RecompileError, compile_module, find_cause
from reference_impl.config import CompilationConfig, CompilationMode, KernelConfig, RuntimeConfig
from reference_impl.custom_op import CustomOp
from reference_impl.layers.layernorm import RMSNorm
from _compile_support import count

HIDDEN = 32


@CustomOp.register("compile_test_gate")
class ToyGate(CustomOp):
    """silu(x[..., :d]) * x[..., d:]: torch ops when native, the IR op on the CPU path."""

    def forward_native(self, x):
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]

    def forward_cpu(self, x):
        return ir.ops.silu_and_mul(x)


class TinyBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = RMSNorm(HIDDEN)
        self.up = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
        self.gate = ToyGate()
        with torch.no_grad():
            self.norm.weight.copy_(torch.linspace(0.5, 1.5, HIDDEN))

    def forward(self, x, residual):
        h, residual = self.norm(x, residual)
        return self.gate(self.up(h)), residual


# The compile platform, test providers and a private inductor cache for every test (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("inductor_env")


def _config(mode=CompilationMode.REFERENCE_COMPILE, backend="inductor", custom_ops=(), priority=None):
    return RuntimeConfig(CompilationConfig(mode=mode, backend=backend, custom_ops=list(custom_ops)),
                         KernelConfig(priority or {}))


def _inputs(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, HIDDEN, generator=g), torch.randn(n, HIDDEN, generator=g)


def _check_against_eager(module, compiled, n=6, seed=0):
    x, r = _inputs(n, seed)
    ref = module(x.clone(), r.clone())
    out = compiled(x.clone(), r.clone())
    for o, e in zip(out, ref):
        torch.testing.assert_close(o, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("custom_ops, forward, gate_in_graph", [
    ((), "forward_native", False),                     # inductor + compiling mode: custom ops off
    (("+compile_test_gate",), "forward_cpu", True),    # enabled: dispatches as in eager on the CPU
])
def test_custom_ops_follow_the_compilation_config_under_inductor(custom_ops, forward, gate_in_graph):
    torch.manual_seed(0)
    module = TinyBlock()
    compiled = compile_module(module, _config(custom_ops=custom_ops))
    assert compiled.custom_op_forwards["gate"] == forward
    assert compiled.custom_op_forwards["norm"] == "forward_native"   # RMSNorm's IR path is its native forward
    _check_against_eager(module, compiled)
    _check_against_eager(module, compiled, n=9, seed=1)
    backend = compiled.backend
    assert backend.inner == "inductor" and backend.num_compilations == 1
    dynamo = backend.pass_context.after("dynamo")
    assert (count(dynamo, ir.ops.silu_and_mul.torch_op) == 1) is gate_in_graph
    assert count(dynamo, ir.ops.fused_add_rms_norm.maybe_inplace.torch_op) == 1
    assert ("silu_and_mul" in backend.selected_impls) is gate_in_graph


def test_module_config_priorities_drive_the_lowering_and_donate_module_inputs():
    module = TinyBlock()
    config = _config(backend="eager", priority={"fused_add_rms_norm": ["test_inplace_py"]})
    compiled = compile_module(module, config)
    assert compiled.custom_op_forwards["gate"] == "forward_cpu"        # not inductor: custom ops default on
    x, r = _inputs(6)
    with ir.ops.fused_add_rms_norm.set_priority(["test_inplace_py"]):
        ref = module(x.clone(), r.clone())
    out = compiled(x, r)
    for o, e in zip(out, ref):
        torch.testing.assert_close(o, e, atol=1e-5, rtol=1e-5)
    backend = compiled.backend
    assert backend.inner == "aot_eager"
    assert list(backend.selected_impls["fused_add_rms_norm"].values()) == ["test_inplace_py"]
    assert out[1].data_ptr() == r.data_ptr()       # RMSNorm's residual was donated: written in place


def test_eager_stock_and_trace_once_modes():
    module = TinyBlock()
    eager = compile_module(module, _config(mode=CompilationMode.NONE))
    assert eager.backend is None and eager._compiled is module
    _check_against_eager(module, eager)

    stock = compile_module(module, _config(mode=CompilationMode.STOCK_TORCH_COMPILE, backend="aot_eager"))
    assert stock.backend is None
    _check_against_eager(module, stock)

    torch._dynamo.reset()
    once = compile_module(module, _config(mode=CompilationMode.DYNAMO_TRACE_ONCE, backend="aot_eager"),
                          dynamic_batch=False)
    _check_against_eager(module, once, n=6)
    with pytest.raises(Exception) as info:
        once(*_inputs(7))                       # static batch size: a second trace is refused
    assert find_cause(info.value, RecompileError) is not None, repr(info.value)
