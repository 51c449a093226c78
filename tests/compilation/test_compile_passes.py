"""The compile pipeline pass by pass: graphs before and after each pass, on the cheap aot_eager inner.

Functionalization of maybe_inplace and donation tracking, the donated-reuse error, lowering with
the eager selection rule, clone insertion and elimination, rms_norm + fp8 quant fusion, and no
recompilation on a new batch size.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

from reference_impl import ir
from reference_impl.compilation import (
    CompilationPipelineError,
    DonatedInputReuseError,
    ReferenceCompileBackend,
    find_cause,
)
from reference_impl.platforms import activate_platform
from _compile_support import EPS, CompileTestPlatform, clones_of, count, far, ir_nodes, providers

rms_norm, quant = ir.ops.rms_norm, ir.ops.static_quant_fp8
HIDDEN = 32


@pytest.fixture(autouse=True)
def env():
    torch._dynamo.reset()
    with activate_platform(CompileTestPlatform()), providers() as kernel, torch.no_grad():
        yield kernel


def _compile(fn, **kwargs):
    backend = ReferenceCompileBackend(inner="aot_eager", **kwargs)
    return torch.compile(fn, backend=backend, fullgraph=True), backend


def _inputs(n=6, *, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, r = torch.randn(n, HIDDEN, generator=g), torch.randn(n, HIDDEN, generator=g)
    w = torch.randn(HIDDEN, generator=g) * 0.1 + 1
    for t in (x, r):
        torch._dynamo.mark_dynamic(t, 0)
    return x, r, w


def _eager(fn, *args):
    """Eager result of `fn` on clones of `args` (maybe_inplace may consume its inputs)."""
    out = fn(*[a.clone() for a in args])
    return tuple(o.clone() for o in (out if isinstance(out, tuple) else (out,)))


def _assert_same(out, ref):
    out = out if isinstance(out, tuple) else (out,)
    assert len(out) == len(ref)
    for o, e in zip(out, ref):
        torch.testing.assert_close(o.float(), e.float(), atol=1e-5, rtol=1e-5)


# ----- pre-grad: inplace functionalization -------------------------------------------------------
def test_maybe_inplace_becomes_functional_and_donated_inputs_are_recorded():
    def fn(x, r, w):
        return far.maybe_inplace(x, r, w, EPS)

    compiled, backend = _compile(fn)
    x, r, w = _inputs()
    ref = _eager(fn, x, r, w)
    _assert_same(compiled(x, r, w), ref)
    ctx = backend.pass_context
    before, after = ctx.before("inplace_functionalization"), ctx.after("inplace_functionalization")
    assert count(before, far.maybe_inplace.torch_op) == 1 and count(before, far.torch_op) == 0
    assert count(after, far.maybe_inplace.torch_op) == 0 and count(after, far.torch_op) == 1
    assert sorted(ctx.donated_input_names.values()) == ["l_r_", "l_x_"]
    # AOTAutograd saw a functional op: no auto_functionalized wrapper, no write-back into inputs.
    assert ir_nodes(ctx.after("post_grad")) == ["reference_ir.fused_add_rms_norm.default"]
    assert count(ctx.after("post_grad"), torch.ops.aten.copy_.default) == 0


def test_reuse_of_a_donated_activation_is_rejected_at_compile_time_naming_op_and_value():
    def fn(x, r, w):
        out, res = far.maybe_inplace(x, r, w, EPS)
        return out + x, res

    compiled, _ = _compile(fn)
    with pytest.raises(Exception) as info:
        compiled(*_inputs())
    err = find_cause(info.value, DonatedInputReuseError)
    assert err is not None, f"expected DonatedInputReuseError in the chain of {info.value!r}"
    assert isinstance(err, ValueError)
    assert (err.op, err.value) == ("fused_add_rms_norm", "l_x_")
    message = str(err)
    assert "fused_add_rms_norm.maybe_inplace" in message and "'l_x_'" in message and "argument 'x'" in message
    assert "return out + x, res" in message           # the user line that reads it again
    assert err.where is not None and err.where.endswith("return out + x, res")


def test_reuse_through_an_alias_and_double_donation_are_rejected():
    def through_view(x, r, w):
        rows = x.view(-1, HIDDEN // 2)
        out, res = far.maybe_inplace(x, r, w, EPS)
        return out, res, rows.sum()

    def donated_twice(x, r, w):
        return far.maybe_inplace(x, x, w, EPS)

    for fn, needle in [(through_view, "through its alias 'rows'"), (donated_twice, "as both 'x' and 'x_residual'")]:
        torch._dynamo.reset()
        compiled, _ = _compile(fn)
        with pytest.raises(Exception) as info:
            compiled(*_inputs())
        err = find_cause(info.value, DonatedInputReuseError)
        assert err is not None and needle in str(err), f"{fn.__name__}: {info.value!r}"


def test_disjoint_slices_of_one_buffer_are_not_aliases_of_a_donated_slice():
    from reference_impl.ir.ops.rotary import compute_cos_sin_cache

    heads, head_size = 2, 16
    cache = compute_cos_sin_cache(head_size, head_size, 64, 10000.0, torch.float32)

    def attention_inputs(positions, qkv):
        d = heads * head_size
        q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
        q, k = ir.ops.rotary_embedding.maybe_inplace(positions, q, k, head_size, cache, True)
        return q, k, v * 2          # v shares qkv's storage but not q's or k's bytes

    def reads_the_base(positions, qkv):
        d = heads * head_size
        q, k = ir.ops.rotary_embedding.maybe_inplace(positions, qkv[:, :d], qkv[:, d:2 * d], head_size, cache, True)
        return q, k, qkv.sum()      # qkv holds the donated q and k

    positions = torch.arange(6)
    qkv = torch.randn(6, 3 * heads * head_size)
    compiled, _ = _compile(attention_inputs)
    _assert_same(compiled(positions, qkv.clone()), _eager(attention_inputs, positions, qkv))

    torch._dynamo.reset()
    compiled, _ = _compile(reads_the_base)
    with pytest.raises(Exception) as info:
        compiled(positions, qkv.clone())
    err = find_cause(info.value, DonatedInputReuseError)
    assert err is not None and err.op == "rotary_embedding" and "qkv.sum()" in str(err), repr(info.value)


def test_reading_only_metadata_of_a_donated_value_is_allowed():
    from reference_impl.compilation import InplaceFunctionalizationPass, PassContext

    def size_after(x, r, w):
        out, res = far.maybe_inplace(x, r, w, EPS)
        return out * x.size(0), res

    def data_after(x, r, w):
        out, res = far.maybe_inplace(x, r, w, EPS)
        return out * x, res

    graph = torch.fx.symbolic_trace(size_after).graph
    ctx = PassContext()
    InplaceFunctionalizationPass()(graph, ctx)
    assert count(graph, far.torch_op) == 1 and sorted(ctx.donated_input_names.values()) == ["r", "x"]
    with pytest.raises(DonatedInputReuseError, match="'x' was donated"):
        InplaceFunctionalizationPass()(torch.fx.symbolic_trace(data_after).graph, PassContext())


# ----- post-grad: lowering ------------------------------------------------------------------------
def test_lowering_inlines_the_provider_eager_dispatch_selects_and_logs_it(env, caplog):
    def fn(x, w):
        return rms_norm(x, w, EPS), rms_norm(x, w, EPS, 16)

    compiled, backend = _compile(fn)
    x, _, w = _inputs()
    with rms_norm.set_priority(["test_kernel"]), caplog.at_level(logging.DEBUG, "reference_impl.compilation"):
        eager_providers = sorted([rms_norm.dispatch(x, w, EPS).provider, rms_norm.dispatch(x, w, EPS, 16).provider])
        out = compiled(x, w)
        ref = _eager(fn, x, w)
    _assert_same(out, ref)
    assert eager_providers == ["native", "test_kernel"]
    assert sorted(backend.selected_impls["rms_norm"].values()) == eager_providers
    assert any(issubclass(t, FakeTensor) for t in env.supports_calls), "supports_args never saw fake tensors"

    ctx = backend.pass_context
    assert count(ctx.before("ir_lowering"), rms_norm.torch_op) == 2
    lowered = ctx.after("ir_lowering")
    assert ir_nodes(lowered) == []
    assert count(lowered, torch.ops.compile_test.rms_norm.default) == 1     # the test_kernel node
    assert count(lowered, torch.ops.aten.rsqrt.default) == 1                # the native node, traced
    logged = [r.getMessage() for r in caplog.records if "ir_lowering" in r.getMessage()]
    assert any("rms_norm -> provider 'test_kernel'" in m for m in logged), logged


@pytest.mark.parametrize("form", ["maybe_inplace", "functional"])
def test_inplace_provider_is_lowered_with_clones_removed_only_for_donated_inputs(form):
    call = far.maybe_inplace if form == "maybe_inplace" else far

    def fn(x, r, w):
        return call(x, r, w, EPS)

    compiled, backend = _compile(fn)
    x, r, w = _inputs()
    x0, r0 = x.clone(), r.clone()
    with far.set_priority(["test_inplace_py"]):
        ref = _eager(fn, x, r, w)
        out = compiled(x, r, w)
    _assert_same(out, ref)
    ctx = backend.pass_context
    assert backend.selected_impls == {"fused_add_rms_norm": {"fused_add_rms_norm": "test_inplace_py"}}
    inputs = [n.name for n in ctx.after("post_grad").nodes if n.op == "placeholder"]
    lowered, final = ctx.after("ir_lowering"), ctx.after("clone_elimination")
    assert sorted(clones_of(lowered)) == sorted(inputs[1:3])       # x and residual (inputs[0] is the batch size)
    assert count(lowered, torch.ops.aten.copy_.default) == 2
    if form == "maybe_inplace":
        assert clones_of(final) == []
        written = [n.args[0].name for n in final.nodes if n.target is torch.ops.aten.copy_.default]
        assert sorted(written) == sorted(inputs[1:3])               # zero-copy: writes go to the inputs
    else:
        assert sorted(clones_of(final)) == sorted(inputs[1:3])
        assert all("is not donated" in note for note in ctx.notes["clone_elimination"])
        assert torch.equal(x, x0) and torch.equal(r, r0)            # functional: inputs untouched


def test_clone_of_an_intermediate_is_removed_only_when_nothing_reads_it_later():
    def dead_after(x, r, w):
        y = x * 2
        return far(y, r, w, EPS)

    def read_after(x, r, w):
        y = x * 2
        out, res = far(y, r, w, EPS)
        return out + y, res

    def read_by_second_call(x, r, w):
        y = x * 2
        a, _ = far(y, r, w, EPS)
        b, _ = far(y, a, w, EPS)
        return a, b

    expected_kept = {dead_after: 1, read_after: 2, read_by_second_call: 3}
    for fn, kept in expected_kept.items():
        torch._dynamo.reset()
        compiled, backend = _compile(fn)
        x, r, w = _inputs()
        with far.set_priority(["test_inplace_py"]):
            ref = _eager(fn, x, r, w)
            _assert_same(compiled(x, r, w), ref)
        final = backend.pass_context.after("clone_elimination")
        # `r` (a non-donated input) always keeps its clone; `y` keeps one while a later reader exists.
        assert len(clones_of(final)) == kept, (fn.__name__, backend.pass_context.notes["clone_elimination"])


def test_clone_that_changes_layout_is_kept_even_for_a_donated_input():
    def fn(x, r, w):
        return far.maybe_inplace(x, r, w, EPS)

    compiled, backend = _compile(fn)
    x, r, w = _inputs()
    wide = torch.zeros(x.shape[0], 2 * HIDDEN)
    wide[:, ::2] = x
    strided = wide[:, ::2]
    torch._dynamo.mark_dynamic(strided, 0)
    with far.set_priority(["test_inplace_py"]):
        ref = _eager(fn, strided, r, w)
        _assert_same(compiled(strided, r, w), ref)
    notes = backend.pass_context.notes["clone_elimination"]
    assert len(clones_of(backend.pass_context.after("clone_elimination"))) == 1
    assert any("changes the layout" in n for n in notes), notes


def test_no_ir_op_may_survive_lowering():
    backend = ReferenceCompileBackend(inner="aot_eager")
    from reference_impl.compilation import InplaceFunctionalizationPass

    # Without the pre-grad pass, AOTAutograd wraps maybe_inplace in auto_functionalized; lowering must refuse.
    backend.pass_manager.passes = [p for p in backend.pass_manager.passes
                                   if not isinstance(p, InplaceFunctionalizationPass)]
    compiled = torch.compile(lambda x, r, w: far.maybe_inplace(x, r, w, EPS), backend=backend, fullgraph=True)
    with pytest.raises(Exception) as info:
        compiled(*_inputs())
    err = find_cause(info.value, CompilationPipelineError)
    assert err is not None and "IR ops left in the lowered graph" in str(err)


# ----- post-grad: fusion ----------------------------------------------------------------------------
def _scale(x, w):
    return (rms_norm.native_fn(x, w, EPS).abs().amax() / 448.0).reshape(1)


def test_rms_norm_then_static_quant_is_fused_into_one_op():
    def fn(x, w, scale):
        return quant(rms_norm(x, w, EPS), scale)

    compiled, backend = _compile(fn)
    x, _, w = _inputs()
    scale = _scale(x, w)
    _assert_same(compiled(x, w, scale), _eager(fn, x, w, scale))
    ctx = backend.pass_context
    before, after = ctx.before("rms_norm_quant_fusion"), ctx.after("rms_norm_quant_fusion")
    assert count(before, rms_norm.torch_op) == 1 and count(before, quant.torch_op) == 1
    assert count(after, rms_norm.torch_op) == 0 and count(after, quant.torch_op) == 0
    assert count(after, ir.ops.rms_norm_static_fp8_quant.torch_op) == 1
    assert {op: list(nodes.values()) for op, nodes in backend.selected_impls.items()} == {
        "rms_norm_static_fp8_quant": ["native"]}


def test_fused_add_rms_norm_then_quant_is_fused_and_residual_kept():
    def fn(x, r, w, scale):
        out, res = far.maybe_inplace(x, r, w, EPS)
        return quant(out, scale), res * 2

    compiled, backend = _compile(fn)
    x, r, w = _inputs()
    scale = _scale(x, w)
    _assert_same(compiled(x, r, w, scale), _eager(fn, x, r, w, scale))
    after = backend.pass_context.after("rms_norm_quant_fusion")
    assert count(after, ir.ops.fused_add_rms_norm_static_fp8_quant.torch_op) == 1
    assert count(after, far.torch_op) == 0 and count(after, quant.torch_op) == 0


def test_no_fusion_when_the_normalized_value_has_another_reader():
    def fn(x, w, scale):
        y = rms_norm(x, w, EPS)
        return quant(y, scale), y

    compiled, backend = _compile(fn)
    x, _, w = _inputs()
    scale = _scale(x, w)
    _assert_same(compiled(x, w, scale), _eager(fn, x, w, scale))
    after = backend.pass_context.after("rms_norm_quant_fusion")
    assert count(after, ir.ops.rms_norm_static_fp8_quant.torch_op) == 0 and count(after, rms_norm.torch_op) == 1

    torch._dynamo.reset()
    compiled, backend = _compile(fn, fusion=False)
    compiled(x, w, scale)
    assert "rms_norm_quant_fusion" not in backend.graph_snapshots


# ----- the backend as a whole --------------------------------------------------------------------
def test_new_batch_size_does_not_recompile_and_stays_zero_copy():
    def fn(x, r, w):
        return far.maybe_inplace(x, r, w, EPS)

    compiled, backend = _compile(fn)
    with far.set_priority(["test_inplace_py"]):
        for n in (6, 11, 3):
            x, r, w = _inputs(n, seed=n)
            ref = _eager(fn, x, r, w)
            out = compiled(x, r, w)
            _assert_same(out, ref)
            assert out[0].data_ptr() == x.data_ptr() and out[1].data_ptr() == r.data_ptr()
    assert backend.num_compilations == 1


def test_backend_introspection_and_knobs():
    with pytest.raises(ValueError, match="inner compiler 'tvm'"):
        ReferenceCompileBackend(inner="tvm")
    backend = ReferenceCompileBackend(inner="eager")
    assert backend.inner == "aot_eager"
    assert backend.selected_impls == {} and backend.graph_snapshots == {}
    with pytest.raises(RuntimeError, match="has not compiled anything"):
        backend.pass_context
    compiled = torch.compile(lambda x, w: rms_norm(x, w, EPS), backend=backend, fullgraph=True)
    x, _, w = _inputs()
    compiled(x, w)
    assert list(backend.graph_snapshots) == backend.stages()
    assert set(backend.pass_context.pass_seconds) == set(backend.pass_manager.names())
    assert backend.lowering_pass.selected_impls == backend.selected_impls
