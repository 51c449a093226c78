"""The dispatch family's supports_args probes in-process: each kind of predicate gets the verdict the
contract gives it (docs/plugin-api.md §3), without a plugin or a subprocess."""

from __future__ import annotations

import types

import pytest
import torch

import reference_impl.ir.ops  # noqa: F401 - declares the ops
from conformance.checks import fakes, predicates
from conformance.checks.common import CheckContext
from conformance.checks.dispatch import case_inputs
from reference_impl import ir

# A stand-in platform: the device is named here, not taken from whatever platform is current.
PLATFORM = types.SimpleNamespace(device_type="cpu", supported_dtypes=[torch.float32, torch.bfloat16])


def _verdict(fn) -> str | None:
    """The first problem any probe finds over rms_norm's quick cases, prefixed with the case."""
    op = ir.ops.rms_norm
    impl = types.SimpleNamespace(supports_args=fn)
    ctx = CheckContext("probe", PLATFORM, level="quick")
    for case_name, dtype, args in case_inputs(ctx, op):
        answer = fn(*args)
        assert type(answer) is bool
        problem = (predicates.at_batch_sizes(op, impl, args, answer)
                   or predicates.symbolic_batch(op, impl, args, answer)
                   or predicates.every_dim_symbolic(op, impl, args))
        if problem:
            return f"{case_name}: {problem}"
    return None


ALLOWED = {
    "contiguity": lambda x, w, e, v=None: x.is_contiguous(),
    "declines one row": lambda x, w, e, v=None: x.shape[0] > 1,
    "even hidden size": lambda x, w, e, v=None: x.shape[-1] % 2 == 0,
    "hidden size as int": lambda x, w, e, v=None: int(x.shape[-1]) <= 4096,
    "dtype and weight": lambda x, w, e, v=None: x.dtype != torch.float64 and (w is None or w.stride(0) == 1),
}


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_static_predicates_pass_every_probe(name):
    assert _verdict(ALLOWED[name]) is None


REJECTED = {   # name -> (predicate, fragments the message must hold)
    "small threshold": (lambda x, w, e, v=None: x.shape[0] >= 4,
                        ["guards on the batch size", "False with 2 rows", "True with 17 rows"]),
    "large threshold": (lambda x, w, e, v=None: x.shape[0] <= 256,
                        ["guards on the batch size", "True with 2 rows", "False with 257 rows"]),
    "int32 element count": (lambda x, w, e, v=None: x.numel() < 2**31,
                            ["guards on the batch size", "SymBool(", "x.shape[0]"]),
    "data pointer alignment": (lambda x, w, e, v=None: x.data_ptr() % 16 == 0,
                               ["raised on fake tensors", "Cannot access data pointer", "read no tensor data"]),
    "tensor values": (lambda x, w, e, v=None: bool((x.abs() < 1e4).all()),
                      ["raised on fake tensors", "read no tensor data"]),
    "real tensors only": (lambda x, w, e, v=None: type(x) is torch.Tensor,
                          ["True on real tensors but False on fake tensors"]),
    "hidden size in a set": (lambda x, w, e, v=None: x.shape[-1] in {128, 256, 512, 769, 1000, 1024},
                             ["raised with every dimension symbolic", "TypeError: unhashable type"]),
}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_batch_dependent_or_unsafe_predicates_fail_with_the_reason(name):
    fn, fragments = REJECTED[name]
    problem = _verdict(fn)
    assert problem is not None
    for fragment in fragments:
        assert fragment in problem, problem
    assert " at 0x" not in problem


def test_symbolic_probe_alone_finds_a_guard_above_every_concrete_size():
    """A threshold beyond the largest fake batch is still a guard under a symbolic batch."""
    op = ir.ops.rms_norm
    args = (torch.randn(5, 64), torch.ones(64), 1e-6, None)
    impl = types.SimpleNamespace(supports_args=lambda x, w, e, v=None: bool(x.shape[0] <= 10**6))
    assert predicates.at_batch_sizes(op, impl, args, True) is None
    problem = predicates.symbolic_batch(op, impl, args, True)
    assert problem is not None and "x.shape[0] <= 1000000" in problem, problem


def test_every_dim_probe_sees_symbols_and_accepts_a_symbool_of_them():
    op = ir.ops.rms_norm
    args = (torch.randn(5, 64), torch.ones(64), 1e-6, None)
    fa = fakes.symbolic(op, args, every_dim=True)
    answer = fa.args[0].shape[-1] % 2 == 0
    assert isinstance(answer, torch.SymBool) and not fa.involves_batch(answer.node.expr)
    assert fa.render(answer.node.expr) == "Eq(Mod(x.shape[1], 2), 0)"
    impl = types.SimpleNamespace(supports_args=lambda x, w, e, v=None: x.shape[-1] % 2 == 0)
    assert predicates.every_dim_symbolic(op, impl, args) is None


def test_fakes_cost_nothing_and_keep_the_layout():
    op = ir.ops.rms_norm
    wide = torch.zeros(5, 1007)[:, :1000]
    fa = fakes.BatchFakes(op, (wide, torch.ones(1000), 1e-6, None)).at(65537)
    x = fa.args[0]
    assert x.shape == (65537, 1000) and x.stride() == (1007, 1) and x.dtype == wide.dtype
    assert x.device == wide.device
    with pytest.raises(RuntimeError, match="data pointer"):
        x.data_ptr()


def test_symbolic_fakes_of_views_keep_strides_and_offset_and_record_no_guard():
    """Fakes are built from meta tensors (not converted): a slice of a fused qkv keeps its row stride and storage
    offset, its batch is the one duck-sized symbol, and building them records no guard."""
    op = ir.ops.rotary_embedding
    qkv = torch.randn(7, 3 * 64)
    cache = torch.randn(32, 16)
    args = (torch.arange(7), qkv[:, :64], qkv[:, 64:128], 16, cache, True)
    for every_dim in (False, True):
        fa = fakes.symbolic(op, args, every_dim=every_dim)
        q, k = fa.args[1], fa.args[2]
        assert fa.shape_env.guards == []
        assert q.shape[0] is not None and fa.involves_batch(q.shape[0].node.expr)
        assert q.shape[0].node.expr == k.shape[0].node.expr == fa.args[0].shape[0].node.expr
        offset = k.storage_offset()
        assert k.stride(0).node.hint == 192 and (offset.node.hint if isinstance(offset, torch.SymInt) else offset) == 64
        assert isinstance(q.shape[1], torch.SymInt) is every_dim and q.device == qkv.device and q.dtype == qkv.dtype
        assert fa.render(k.stride(0).node.expr) == "x_query.stride(0)"   # one symbol for the shared row stride
        assert fa.shape_env.guards == []
