"""`torch.compile(dynamic=True)` with symbolic non-batch sizes: predicates answering SymBool are
guarded on (the compiled graph is specialised on that static property and recompiles when it
changes), a predicate that fails on symbolic sizes is an IrDispatchError saying what to do, the
decoder-layer function with the project's own providers matches eager, and the README's runtime
example runs as written (docs/ir-dispatch.md)."""

from __future__ import annotations

import contextlib
import io
import itertools
import pathlib
import re

import pytest
import torch
from torch import Tensor

from reference_impl import ir
from reference_impl.compilation import ReferenceCompileBackend
from reference_impl.ir import IrDispatchError
from reference_impl.platforms import CpuPlatform, activate_platform

REPO = pathlib.Path(__file__).resolve().parents[2]
EPS = 1e-6
_ids = itertools.count()


@pytest.fixture(autouse=True)
def cpu_platform():
    """The built-in cpu platform (its cpp provider is the one whose predicate broke dynamic=True),
    activated as an instance so the test means the same on a machine with an accelerator."""
    torch._dynamo.reset()
    with activate_platform(CpuPlatform()) as platform, torch.no_grad():
        yield platform
    torch._dynamo.reset()


# ----- guards on a predicate's SymBool answer ---------------------------------------------------
_runs: list[str] = []


@torch.library.custom_op("ir_dynamic_test::tagged_gelu_and_mul", mutates_args=())
def _tagged(x: Tensor, tag: str) -> Tensor:
    """Stand-in kernel that records at run time which provider a compiled graph calls."""
    _runs.append(tag)
    return ir.ops.gelu_and_mul.native_fn(x)


@_tagged.register_fake
def _(x, tag):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@contextlib.contextmanager
def _width_provider():
    """A gelu_and_mul provider accepting widths that are multiples of 64, preferred over native."""
    op = ir.ops.gelu_and_mul
    name = f"test_w64_{next(_ids)}"
    op.register_impl(name, supports_args=lambda x, approximate="none": x.shape[-1] % 64 == 0)(
        lambda x, approximate="none": _tagged(x, "w64"))
    try:
        with op.set_priority([name]):
            yield name
    finally:
        op.remove_impl(name)


def test_symbolic_answer_is_guarded_so_a_new_width_reselects():
    _runs.clear()
    backend = ReferenceCompileBackend(inner="aot_eager")
    with _width_provider() as provider:
        compiled = torch.compile(lambda x: ir.ops.gelu_and_mul(x), backend=backend, fullgraph=True,
                                 dynamic=True)
        for rows, width in ((4, 128), (5, 256)):          # same guard outcome: one graph
            x = torch.randn(rows, width)
            torch.testing.assert_close(compiled(x), ir.ops.gelu_and_mul.native_fn(x))
        assert backend.num_compilations == 1
        assert backend.selected_impls["gelu_and_mul"] == {"gelu_and_mul": provider}
        assert _runs == ["w64", "w64"]

        x = torch.randn(4, 96)                             # width % 64 != 0: the guard fails
        torch.testing.assert_close(compiled(x), ir.ops.gelu_and_mul.native_fn(x))
        assert backend.num_compilations == 2
        assert backend.selected_impls["gelu_and_mul"] == {"gelu_and_mul": "native"}
        assert _runs == ["w64", "w64"]

        compiled(torch.randn(3, 192))                      # the first graph again, no new compile
        assert backend.num_compilations == 2
        assert _runs == ["w64", "w64", "w64"]


def test_a_predicate_failing_on_symbolic_sizes_says_what_to_do():
    op = ir.ops.gelu_and_mul
    name = f"test_hashing_{next(_ids)}"
    widths = {128: True}
    op.register_impl(name, supports_args=lambda x, approximate="none": widths.get(x.shape[-1], False))(
        lambda x, approximate="none": op.native_fn(x, approximate))
    try:
        with op.set_priority([name]):
            assert op.dispatch(torch.randn(4, 128)).provider == name      # eager: plain ints
            compiled = torch.compile(lambda x: op(x), backend=ReferenceCompileBackend(inner="aot_eager"),
                                     fullgraph=True, dynamic=True)
            with pytest.raises(Exception) as info:
                compiled(torch.randn(4, 128))
    finally:
        op.remove_impl(name)
    chain, exc = [], info.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    errors = [e for e in chain if isinstance(e, IrDispatchError)]
    assert errors, f"no IrDispatchError in {[type(e).__name__ for e in chain]}"
    message = str(errors[0])
    assert f"provider '{name}' for op 'gelu_and_mul' raised TypeError" in message
    assert "mark_dynamic(x, 0) instead of dynamic=True" in message
    assert "read only static properties" in message
    assert not re.search(r"0x[0-9a-f]{6,}", message)


def test_non_bool_answers_stay_errors_in_eager_and_compile():
    op = ir.ops.gelu_and_mul
    name = f"test_int_{next(_ids)}"
    op.register_impl(name, supports_args=lambda x, approximate="none": 1)(
        lambda x, approximate="none": op.native_fn(x, approximate))
    try:
        with op.set_priority([name]), pytest.raises(IrDispatchError, match="returned int, not a Python bool"):
            op(torch.randn(2, 8))
    finally:
        op.remove_impl(name)


# ----- the decoder-layer function with the cpu platform's own providers -------------------------
HIDDEN, INTER = 64, 96


def _layer(x, residual, w1, w2, up, down):
    """norm + residual add (in place), gated MLP, norm + residual add again."""
    h, residual = ir.ops.fused_add_rms_norm.maybe_inplace(x, residual, w1, 1e-6)
    h = ir.ops.silu_and_mul(h @ up)
    h = ir.ops.gelu_fast(h) @ down
    return ir.ops.fused_add_rms_norm.maybe_inplace(h, residual, w2, 1e-6)   # a literal: dynamo makes a global float an input


def _inputs(rows, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, HIDDEN, generator=g), torch.randn(rows, HIDDEN, generator=g),
            torch.randn(HIDDEN, generator=g) * 0.1 + 1, torch.randn(HIDDEN, generator=g) * 0.1 + 1,
            torch.randn(HIDDEN, 2 * INTER, generator=g) * HIDDEN ** -0.5,
            torch.randn(INTER, HIDDEN, generator=g) * INTER ** -0.5]


def test_dynamic_true_decoder_layer_matches_eager_with_the_cpp_provider():
    args = _inputs(8, 0)
    eager_providers = {name: getattr(ir.ops, name).dispatch(*call).provider for name, call in (
        ("fused_add_rms_norm", (args[0], args[1], args[2], EPS)),
        ("silu_and_mul", (torch.randn(8, 2 * INTER),)), ("gelu_fast", (torch.randn(8, INTER),)))}
    backend = ReferenceCompileBackend(inner="aot_eager")
    compiled = torch.compile(_layer, backend=backend, fullgraph=True, dynamic=True)
    for rows, seed in ((8, 0), (13, 1)):
        args = _inputs(rows, seed)
        expected = _layer(*[a.clone() for a in args])
        for got, want in zip(compiled(*[a.clone() for a in args]), expected):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert backend.num_compilations == 1
    lowered = {op: set(nodes.values()) for op, nodes in backend.selected_impls.items()}
    assert lowered == {op: {provider} for op, provider in eager_providers.items()}


def test_readme_runtime_example_runs_as_written():
    """The python block of README.md's "Using the reference as a runtime", executed unchanged."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Using the reference as a runtime", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    printed = out.getvalue().splitlines()
    x = torch.randn(8, 4096, dtype=torch.bfloat16)
    provider = ir.ops.rms_norm.dispatch(x, torch.ones(4096, dtype=torch.bfloat16), 1e-6).provider
    assert printed[0] == provider
    assert re.fullmatch(rf"\{{'rms_norm': \{{'\w+': '{provider}'\}}\}}", printed[1]), printed[1]
