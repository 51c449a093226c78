"""The pipeline with inductor: a decoder-layer-shaped function matches eager, and with an in-place
provider and donated inputs the generated code allocates fewer buffers than with the functional
overload or a functional provider.
"""

from __future__ import annotations

import re
import time

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from reference_impl import ir
from reference_impl.compilation import ReferenceCompileBackend
from _compile_support import EPS, clones_of, far

HIDDEN, INTER = 64, 96
_ALLOC = re.compile(r"\bbuf\d+ = empty_strided_\w+\(")


# The compile platform, test providers and a private inductor cache for every test (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("inductor_env")


def _decoder_layer(call):
    """norm + residual add, MLP with a gated activation, norm + residual add again."""
    def layer(x, residual, w1, w2, up, down):
        h, residual = call(x, residual, w1, EPS)
        h = ir.ops.silu_and_mul(h @ up)
        h = h @ down
        return call(h, residual, w2, EPS)
    return layer


def _inputs(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, r = torch.randn(n, HIDDEN, generator=g), torch.randn(n, HIDDEN, generator=g)
    w1, w2 = torch.randn(HIDDEN, generator=g) * 0.1 + 1, torch.randn(HIDDEN, generator=g) * 0.1 + 1
    up = torch.randn(HIDDEN, 2 * INTER, generator=g) * HIDDEN ** -0.5
    down = torch.randn(INTER, HIDDEN, generator=g) * INTER ** -0.5
    for t in (x, r):
        torch._dynamo.mark_dynamic(t, 0)
    return [x, r, w1, w2, up, down]


CONFIGS = {
    "maybe_inplace+inplace provider": (far.maybe_inplace, "test_inplace_op"),
    "functional overload+inplace provider": (far, "test_inplace_op"),
    "maybe_inplace+native provider": (far.maybe_inplace, "native"),
}


def test_decoder_layer_matches_eager_and_inplace_donation_saves_buffers(record_property):
    allocations, seconds = {}, {}
    for label, (call, provider) in CONFIGS.items():
        torch._dynamo.reset()
        layer = _decoder_layer(call)
        backend = ReferenceCompileBackend(inner="inductor")
        compiled = torch.compile(layer, backend=backend, fullgraph=True)
        args = _inputs(8)
        with far.set_priority([provider]), ir.ops.silu_and_mul.set_priority(["native"]):
            ref = [t.clone() for t in layer(*[a.clone() for a in args])]
            start = time.perf_counter()
            out, code = run_and_get_code(compiled, *args)
            seconds[label] = time.perf_counter() - start
            for o, e in zip(out, ref):
                torch.testing.assert_close(o, e, atol=1e-5, rtol=1e-5)
            # a new batch size runs the same compiled code
            args2 = _inputs(13, seed=1)
            ref2 = [t.clone() for t in layer(*[a.clone() for a in args2])]
            for o, e in zip(compiled(*args2), ref2):
                torch.testing.assert_close(o, e, atol=1e-5, rtol=1e-5)
        assert backend.num_compilations == 1, label
        assert sorted(backend.selected_impls["fused_add_rms_norm"].values()) == [provider, provider]
        allocations[label] = len(_ALLOC.findall("\n".join(code)))
        if label == "maybe_inplace+inplace provider":
            final = backend.pass_context.after("clone_elimination")
            assert clones_of(final) == []
            kernel_calls = re.findall(r"compile_test\.fused_add_rms_norm_\.default\((\w+), (\w+),", "\n".join(code))
            assert len(kernel_calls) == 2 and kernel_calls[0][0].startswith("arg"), kernel_calls
            assert out[1].data_ptr() == args[1].data_ptr()          # residual written in place
    record_property("allocations", allocations)
    record_property("compile_seconds", seconds)
    print("\ninductor buffer allocations per decoder layer:", allocations)
    print("first-call (compile + run) seconds:", {k: round(v, 2) for k, v in seconds.items()})
    inplace = allocations["maybe_inplace+inplace provider"]
    assert inplace < allocations["functional overload+inplace provider"]
    assert inplace < allocations["maybe_inplace+native provider"]
