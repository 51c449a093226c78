"""The IR selection cache: a predicate runs once per static signature, a batch-size change reuses
the selection, and a change of priority, config, platform, registration or static signature
selects again (docs/ir-dispatch.md)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import Tensor

from reference_impl import config, ir, platforms
from reference_impl.config import KernelConfig, RuntimeConfig, set_current_config
from reference_impl.ir import guard
from reference_impl.ir.signature import BATCH, exact_signature, static_signature
from reference_impl.platforms import Platform, PlatformEnum, activate_platform

_ids = itertools.count()


class DefaultsPlatform(Platform):
    """A CPU platform whose IR defaults a test sets."""

    _enum = PlatformEnum.CPU
    device_name = "cache_test_cpu"

    def __init__(self, defaults: dict | None = None):
        self.defaults = defaults or {}

    def get_default_ir_op_priority(self):
        return self.defaults


class Counting:
    """A provider whose predicate counts its calls and accepts what `rule` accepts."""

    def __init__(self, rule=lambda x, weight, factor: True):
        self.rule = rule
        self.calls = 0

    def __call__(self, x, weight, factor):
        self.calls += 1
        return self.rule(x, weight, factor)


def _scale_op():
    """A fresh op (torch library ops are permanent, so one per test) with a counting provider 'fast'."""
    def scale(x: Tensor, weight: Tensor | None, factor: float = 2.0) -> Tensor:
        return x * factor if weight is None else x * factor * weight

    op = ir.register_op(name=f"t_cache_scale_{next(_ids)}")(scale)
    predicate = Counting(lambda x, weight, factor: x.dtype == torch.float32)
    op.register_impl("fast", supports_args=predicate)(lambda x, weight, factor=2.0: x * factor + 1000)
    return op, predicate


@pytest.fixture(autouse=True)
def cache_platform():
    with activate_platform(DefaultsPlatform()) as platform:
        yield platform


def test_predicate_runs_once_per_signature_and_batch_sizes_share_it():
    op, predicate = _scale_op()
    with op.set_priority(["fast"]):
        for _ in range(3):
            assert op.dispatch(torch.ones(4, 8), None).provider == "fast"
            op(torch.ones(4, 8), None)
            op(torch.ones(4, 8), None, 2.0)           # the default spelled out: same signature
        assert predicate.calls == 1
        for rows in (2, 5, 64):                      # batch >= 2: the selection is reused
            assert torch.equal(op(torch.ones(rows, 8), None), torch.full((rows, 8), 1002.0))
        assert predicate.calls == 1
        op(torch.ones(1, 8), None)                   # batch 1 is its own signature (compile specialises it)
        assert predicate.calls == 2


@pytest.mark.parametrize("change", [
    "dtype", "hidden size", "strides", "device", "weight present", "weight dtype", "factor value", "factor type",
])
def test_a_changed_static_signature_asks_the_predicate_again(change):
    op, predicate = _scale_op()
    x, w = torch.ones(4, 8), torch.ones(8)
    other = {
        "dtype": (x.double(), w, 2.0),
        "hidden size": (torch.ones(4, 6), torch.ones(6), 2.0),
        "strides": (torch.ones(8, 4).t(), w, 2.0),
        "device": (x.to("meta"), w, 2.0),
        "weight present": (x, None, 2.0),
        "weight dtype": (x, w.half(), 2.0),
        "factor value": (x, w, 3.0),
        "factor type": (x, w, 2),
    }[change]
    with op.set_priority(["fast"]):
        assert op.dispatch(x, w, 2.0).provider == "fast"
        assert predicate.calls == 1
        expected = "native" if change == "dtype" else "fast"
        assert op.dispatch(*other).provider == expected
        assert predicate.calls == 2


def test_eager_calls_select_again_on_a_new_dtype():
    op, predicate = _scale_op()
    with op.set_priority(["fast"]):
        assert torch.equal(op(torch.ones(3, 4), None), torch.full((3, 4), 1002.0))
        assert torch.equal(op(torch.ones(3, 4, dtype=torch.float64), None),
                           torch.full((3, 4), 2.0, dtype=torch.float64))     # native
        assert torch.equal(op(torch.ones(3, 4), None), torch.full((3, 4), 1002.0))
    assert predicate.calls == 2


def test_set_priority_selects_again():
    op, predicate = _scale_op()
    x = torch.ones(4, 8)
    with op.set_priority(["fast"]):
        assert op(x, None)[0, 0] == 1002
    assert op(x, None)[0, 0] == 2                        # back to the platform's (empty) defaults: native
    with op.set_priority(["fast"]):
        assert op(x, None)[0, 0] == 1002
    assert predicate.calls == 2


def test_user_priorities_in_a_new_config_select_again():
    op, predicate = _scale_op()
    x = torch.ones(4, 8)
    assert op(x, None)[0, 0] == 2
    with set_current_config(RuntimeConfig(kernel_config=KernelConfig({op.name: ["fast"]}))):
        assert op(x, None)[0, 0] == 1002
    assert op(x, None)[0, 0] == 2
    assert predicate.calls == 1


def test_a_platform_change_selects_again(cache_platform):
    op, predicate = _scale_op()
    x = torch.ones(4, 8)
    assert op(x, None)[0, 0] == 2
    with activate_platform(DefaultsPlatform({op.name: ["fast"]})):
        assert op(x, None)[0, 0] == 1002
    assert op(x, None)[0, 0] == 2
    assert predicate.calls == 1


def test_registrations_select_again():
    op, predicate = _scale_op()
    x = torch.ones(4, 8)
    with activate_platform(DefaultsPlatform({op.name: ["late", "fast"]})):
        assert op(x, None)[0, 0] == 1002
        op.register_impl("late")(lambda x, weight, factor=2.0: x * factor - 1000)
        assert op(x, None)[0, 0] == -998
        op.remove_impl("late")
        assert op(x, None)[0, 0] == 1002
        op.impls["fast"].supported = False
        assert op(x, None)[0, 0] == 2
        op.impls["fast"].supported = True
        op.impls["fast"].supports_args = lambda x, weight, factor: False
        assert op(x, None)[0, 0] == 2


def test_replacing_impl_fn_takes_effect_on_the_next_call():
    """The harness wraps `impl.impl_fn` to count calls; the cache holds impls, not functions."""
    op, _ = _scale_op()
    x = torch.ones(4, 8)
    with op.set_priority(["fast"]):
        assert op(x, None)[0, 0] == 1002
        impl = op.impls["fast"]
        original, impl.impl_fn = impl.impl_fn, lambda x, weight, factor=2.0: x - 7
        try:
            assert op(x, None)[0, 0] == -6
        finally:
            impl.impl_fn = original


def test_generations_are_public_and_move_on_every_change():
    before = config.config_generation(), platforms.platform_generation()
    with set_current_config(RuntimeConfig()):
        assert config.config_generation() > before[0]
    with activate_platform(DefaultsPlatform()):
        assert platforms.platform_generation() > before[1]
    assert config.config_generation() > before[0] + 1
    assert platforms.platform_generation() > before[1] + 1


def test_uncacheable_arguments_ask_the_predicate_every_time():
    op, predicate = _scale_op()
    x = torch.ones(4, 8)
    with op.set_priority(["fast"]):
        for _ in range(2):
            op.dispatch(x, None, float("nan"))        # nan != nan: never the same signature
        assert predicate.calls == 2
        sparse = torch.eye(4).to_sparse()            # reports strides (0, 0), like a broadcast scalar
        broadcast = torch.ones(()).expand(4, 4)
        for _ in range(2):
            op.dispatch(sparse, None)
            op(broadcast, None)
        assert predicate.calls == 6


def test_meta_tensors_go_through_the_torch_op_even_after_a_cached_selection():
    op, _ = _scale_op()
    with op.set_priority(["fast"]):
        assert op.dispatch(torch.ones(4, 8, device="meta"), None).provider == "fast"
        out = op(torch.ones(4, 8, device="meta"), None)     # the fake (native) implementation runs
    assert out.device.type == "meta" and out.shape == (4, 8)


def test_static_signature_marks_batch_dims_and_keeps_coinciding_sizes():
    acts = frozenset({1})
    positions, q, cache = torch.arange(5), torch.ones(5, 16), torch.ones(32, 8)
    key = static_signature((positions, q, 16, cache, True), 1, acts)
    assert key.count(BATCH) == 2                                   # positions and q, not the cache
    same = static_signature((torch.arange(9), torch.ones(9, 16), 16, cache, True), 1, acts)
    assert same == key
    # A non-activation tensor leading with the batch size is taken as batched; if that size also
    # occurs elsewhere (here the hidden size), the exact size stays in the signature.
    w8 = static_signature((torch.ones(8), torch.ones(8, 8)), 1, acts)
    w16 = static_signature((torch.ones(16), torch.ones(16, 8)), 1, acts)
    assert w8 != w16 and w8[0] == 8
    # Batch 1 is exact, batch 0 too.
    assert BATCH not in static_signature((positions[:1], q[:1], 16, cache, True), 1, acts)


@pytest.fixture(params=["torch", "python"])
def guard_kind(request):
    """Run with torch's C++ TensorGuards and with the Python fallback guard."""
    if request.param == "torch":
        assert guard.uses_torch_guards(), "this torch no longer offers TensorGuards as guard.py uses it"
        yield request.param
        return
    previous = guard.set_guard_factory(None)
    try:
        yield request.param
    finally:
        guard.set_guard_factory(previous)


@pytest.mark.parametrize("change", [
    "dtype", "hidden size", "strides", "weight present", "weight absent", "empty weight", "weight dtype",
    "factor value", "factor type", "parameter weight",
])
def test_eager_repeats_are_guarded_per_signature(guard_kind, change):
    """The eager fast path (the latest selection's guard) answers like a fresh selection would."""
    op, predicate = _scale_op()
    x, w = torch.ones(4, 8), torch.ones(8)
    first, other = {
        "dtype": ((x, w, 2.0), (x.double(), w, 2.0)),
        "hidden size": ((x, w, 2.0), (torch.ones(4, 6), torch.ones(6), 2.0)),
        "strides": ((x, w, 2.0), (torch.ones(8, 4).t(), w, 2.0)),
        "weight present": ((x, w, 2.0), (x, None, 2.0)),
        "weight absent": ((x, None, 2.0), (x, w, 2.0)),
        "empty weight": ((torch.ones(4, 0), None, 2.0), (torch.ones(4, 0), torch.empty(0), 2.0)),
        "weight dtype": ((x, w, 2.0), (x, w.half(), 2.0)),
        "factor value": ((x, w, 2.0), (x, w, 3.0)),
        "factor type": ((x, w, 2.0), (x, w, 2)),
        "parameter weight": ((x, w, 2.0), (x, torch.nn.Parameter(w), 2.0)),
    }[change]
    with op.set_priority(["fast"]):
        for _ in range(3):
            op(*first)
        assert predicate.calls == 1
        for _ in range(3):
            out = op(*other)
        assert predicate.calls == (1 if change == "parameter weight" else 2)   # a parameter is a tensor
        fast = change != "dtype"
        factor, weight = other[2], other[1]
        expected = other[0] * factor * (1 if weight is None else weight) + (1000 if fast else 0)
        torch.testing.assert_close(out, expected.detach(), rtol=0, atol=0)
        op(*first)
        assert predicate.calls == (1 if change == "parameter weight" else 2)   # found in the map


def test_parameter_weights_are_cached_like_tensors(guard_kind):
    """A layer passes its weights as nn.Parameter: the predicate must not run on every call."""
    op, predicate = _scale_op()
    weight = torch.nn.Parameter(torch.ones(8), requires_grad=False)
    with op.set_priority(["fast"]):
        for rows in (4, 4, 9, 9):
            assert op(torch.ones(rows, 8), weight)[0, 0] == 1002
    assert predicate.calls == 1


def test_a_guard_failing_on_a_repeated_signature_is_rebuilt(guard_kind):
    """torch's guards also check requires_grad and the grad and inference modes; a signature seen
    under another mode is found in the map, and its guard rebuilt once, not on every call."""
    op, predicate = _scale_op()
    x = torch.ones(4, 8)
    grad_weight = torch.ones(8, requires_grad=True)
    plain_weight = torch.ones(8)
    with op.set_priority(["fast"]):
        op(x, plain_weight)
        first_guard = op.selector.latest.guard
        op(x, grad_weight)
        rebuilt = op.selector.latest.guard
        if guard_kind == "torch":      # the Python guard checks only the signature, so it passes here
            assert rebuilt is not first_guard
        with torch.inference_mode():
            for _ in range(3):
                assert op(x, plain_weight)[0, 0] == 1002
        for _ in range(3):
            op(x, grad_weight)
        assert op.selector.latest is op.selector.exact[exact_signature((x, grad_weight, 2.0))]
    assert predicate.calls == 1


@pytest.mark.parametrize("kind", ["torch", "python"])
def test_a_guard_passes_only_where_the_signature_repeats(kind):
    """Both guards may check more than the signature (torch's: type, requires_grad, dispatch keys)
    but never pass where the signature differs."""
    if kind == "torch" and not guard.uses_torch_guards():
        pytest.fail("this torch no longer offers TensorGuards as reference_impl/ir/guard.py uses it")
    x, w = torch.ones(4, 8), torch.ones(8)
    variants = [(x, w), (torch.zeros(4, 8), torch.zeros(8)), (x.double(), w), (torch.ones(8, 4).t(), w),
                (x, torch.ones(9)), (x, torch.nn.Parameter(w)), (x, w.clone().requires_grad_()),
                (torch.ones(5, 8)[1:], w), (x, None), (x, torch.ones(8, device="meta")),
                (torch.ones(4, 8, dtype=torch.bfloat16), w)]
    signature = exact_signature
    base = guard.make_guard(x, w) if kind == "torch" else guard.PythonGuard(x, w)
    passed = []
    for args in variants:
        if base.check(*args):
            passed.append(args)
            assert signature(args) == signature((x, w)), args
    assert len(passed) >= 3       # the same tensors, equal-metadata tensors, a storage offset


@pytest.mark.parametrize("flags", [[], ["--parameters", "--python-guard"]])
def test_dispatch_benchmark_runs_and_reports_its_target(flags):
    """benchmarks/bench_ir_dispatch.py end to end on two ops (a smoke test, not a timing)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_ir_dispatch.py"
    result = subprocess.run([sys.executable, str(script), "--ops", "rms_norm,rotary_embedding", "--rounds", "2",
                             "--number", "20", *flags], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "target met on" in result.stdout and "of 6 rows" in result.stdout
    guard_kind = "the Python fallback guard" if "--python-guard" in flags else "torch TensorGuards"
    assert guard_kind in result.stdout.splitlines()[0]
