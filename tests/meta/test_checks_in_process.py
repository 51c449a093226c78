"""The fast meta tier: each check run in this process, directly on the broken fixtures' kernels and on the
demo plugin's correct ones, without a pytest subprocess or a kernel worker (about 25 s for the whole tier on
2 cores, against minutes end to end).

The end-to-end runs in tests/harness/test_harness_fixtures.py keep what needs a process: crashes, hangs, the
command line and exit codes. A fixture's modules are imported with its plugin root on sys.path only
for the duration of one test, and every registration it made is undone afterwards, so nothing leaks
into the rest of the suite.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
from pathlib import Path

import pytest
from _registrations import registrations_undone
from harness_runner import PLUGINS, broken_records

from conformance.checks import CheckContext, run_unit
from conformance.collect.inventory import activate
from conformance.results.result import Outcome

RECORDS = broken_records()
# Each fixture's expected verdict, from its module's `EXPECTED = Fault(...)`: the family and outcome that must
# appear with one of its message fragments, and whether some result of that family must still PASS.
EXPECT = {name: fault for name, fault in RECORDS.faults().items() if fault.in_process}


@contextlib.contextmanager
def plugin(dist: str, module: str):
    """`module` importable from tests/plugins/<dist>/ for the block (yields a loader that imports it); every IR
    and register_oot registration made meanwhile is undone afterwards."""
    root = str(PLUGINS / dist)
    package = module.split(".")[0]
    sys.path.insert(0, root)
    try:
        with registrations_undone():
            yield lambda: importlib.import_module(module)
    finally:
        sys.path.remove(root)
        for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
            del sys.modules[name]


def run_family(name: str, make_platform, family: str, dtype: str | None, level: str = "quick") -> list[tuple]:
    """(unit, verdict) for every unit of `family` at `level` the platform brings (one dtype)."""
    from conformance.checks import records

    inventory = activate(name, make_platform)
    ctx = CheckContext(name, inventory.platform, seed=1234, level=level)
    out = []
    for record in records().values():
        if record.family != family:
            continue
        for unit in record.units(inventory, record.family, record.name, level):
            if dtype is None or unit.dtype in (None, dtype):
                out.append((unit, run_unit(ctx, unit)[0]))
    return out


@pytest.mark.parametrize("fault", sorted(EXPECT))
def test_each_broken_fixture_is_caught_by_its_family_in_process(fault):
    expect = EXPECT[fault]
    outcome = Outcome(expect.outcome)
    with plugin("broken", f"conformance_broken.{fault}") as load:
        results = run_family(f"broken_{fault}", lambda: load().Platform(), expect.family, expect.dtype, expect.level)
    caught = [v for _, v in results
              if v.outcome is outcome and any(f in (v.message or "") for f in expect.fragments)]
    seen = sorted({f"{u.check} {v.outcome.value}: {(v.message or '')[:120]}" for u, v in results})
    assert caught, f"{fault}: no {expect.family} {outcome.value} mentioning {expect.fragments!r}; got {seen}"
    if expect.also_passes:
        assert any(v.outcome is Outcome.PASS for _, v in results), f"{fault}: nothing passed: {seen}"


# Controls: fixtures that look suspicious but keep the contract; every check of their family must pass.
CONTROLS = RECORDS.controls()


@pytest.mark.parametrize("dtype", CONTROLS["precise_rotary"].dtypes)
def test_a_kernel_closer_to_float64_than_native_passes_where_native_is_the_less_precise(dtype):
    """precise_rotary rotates in float64 and rounds once. At inputs near 300 (case `large`) in 16-bit dtypes it differs
    from native by more than the tolerance, because native rounds every product: it is the closer of the two to the
    true value, so the result is a PASS that says native is the less precise one (vLLM's CPU rotary kernel met
    exactly this: its error against float64 0.2435, native's 0.387, in float16)."""
    with plugin("broken", "conformance_broken.precise_rotary") as load:
        control = CONTROLS["precise_rotary"]
        results = run_family("broken_precise_rotary", lambda: load().Platform(), control.family, dtype, control.level)
    bad = [f"{u.id}: {v.outcome.value} {v.message}" for u, v in results if v.outcome is not Outcome.PASS]
    assert results and not bad, bad
    large = [v.message for u, v in results if u.case and "large" in u.case.split(",")]
    assert large and all("native itself is the less precise one" in m for m in large), large
    if dtype == "float16":
        assert "max err 0.2435, native's 0.387" in large[0]


def test_a_kernel_further_from_float64_than_native_fails_and_says_so():
    """coarse_rotary rounds cos and sin to 8 bits: in float16 at inputs near 300 it is 4x further from float64 than
    native, so the large case FAILs, naming both errors against float64 and the element behind the ratio."""
    with plugin("broken", "conformance_broken.coarse_rotary") as load:
        results = run_family("broken_coarse_rotary", lambda: load().Platform(), "numerics", "float16", "standard")
    (msg,) = [v.message for u, v in results if u.case == "tokens=3,heads=2/1,head=64,large,neox"]
    assert msg.startswith("output 0: ") and "against float64: implementation max err 1.532, native's 0.387" in msg
    assert "worst at index (2, 81): got 3.758, native 3.438, float64 3.402, abs err 0.3203 = 36.09x the tolerance" in msg
    assert "To accept" not in msg


@pytest.mark.parametrize("family", ["numerics", "aliasing", "dispatch"])
def test_the_demo_plugins_correct_kernels_pass_every_check_in_process(family):
    with plugin("demo", "conformance_demo.platform") as load:
        results = run_family("demo", lambda: load().DemoPlatform(), family, "float32")
    bad = [f"{u.id}: {v.outcome.value} {v.message}" for u, v in results
           if v.outcome not in (Outcome.PASS, Outcome.NOT_IMPLEMENTED, Outcome.NOT_SUPPORTED)]
    assert results and not bad, bad


def test_every_broken_fixture_is_checked_in_process_or_end_to_end():
    """Every fixture module with a record is run by some test: in process, end to end, or by the tests its record
    names (which must exist); and every module defining a Platform has a record, so none is left out unseen."""
    tests = Path(__file__).resolve().parent.parent
    defined = {m.group(1) for path in tests.rglob("test_*.py")
               for m in re.finditer(r"^def (test_\w+)\(", path.read_text(), re.M)}
    records = RECORDS.fixtures()
    unchecked = [name for name, r in records.items()
                 if not (isinstance(r, RECORDS.Fault) and (r.in_process or r.end_to_end)) and not r.checked_by]
    assert unchecked == [], "fixtures no test runs"
    missing = {(name, test) for name, r in records.items() for test in r.checked_by if test not in defined}
    assert missing == set(), "records naming tests that do not exist"
    package = PLUGINS / "broken" / "conformance_broken"
    platforms = {p.stem for p in package.glob("*.py") if re.search(r"^Platform = ", p.read_text(), re.M)}
    assert platforms - set(records) == set(), "fixture modules without an EXPECTED record"


# Cause hints: the fixtures whose record names what the hint over its family's results must say.
HINTS = {name: fault for name, fault in EXPECT.items() if fault.hint}


@pytest.mark.parametrize("fault", sorted(HINTS))
def test_cause_hints_follow_what_the_op_does_and_which_argument_values_fail(fault):
    """The hint names the trait of the failing cases as the op's signature reads it (is_neox_style=True,
    approximate='none'), never offers a tolerance for an ignored argument, and for refusals of accepted arguments
    says to decline them in supports_args, not that a vector loop's tail is dropped."""
    from conformance.judge.hints import cause_hint
    from conformance.results.result import CheckResult

    expect = HINTS[fault]
    with plugin("broken", f"conformance_broken.{fault}") as load:
        results = run_family(f"broken_{fault}", lambda: load().Platform(), expect.family, expect.dtype, expect.level)
    hint = cause_hint([CheckResult(u.id, u.family, u.op, u.provider, u.dtype, u.case, v.outcome, v.message)
                       for u, v in results])
    assert hint is not None and all(fragment in hint for fragment in expect.hint), hint
    if fault == "refuses_tail":
        assert "tail is dropped" not in hint


@pytest.mark.parametrize("dtype", CONTROLS["attn_control"].dtypes)
def test_the_attention_control_passes_every_check_and_is_told_to_declare_sinks(dtype):
    """attn_control is the reference backend declaring sinks unsupported (vLLM 0.32's CPU backend computes sinks
    while declaring them unsupported): every attention check passes, its sink cases are not run by forward, and
    the sinks probe is a PASS saying to declare them. Its platform runs attention as one opaque op, as vLLM's CPU
    platform does, so Dynamo never enters the backend: compile (a float32 unit at quick) is the one SKIP, saying
    so."""
    with plugin("broken", "conformance_broken.attn_control") as load:
        control = CONTROLS["attn_control"]
        results = run_family("broken_attn_control", lambda: load().Platform(), control.family, dtype, control.level)
    not_traced = [u for u, v in results if u.check == "compile" and v.outcome is Outcome.SKIP
                  and v.message.startswith("not traced: the platform's opaque_attention_op() is True")]
    assert [u for u, _ in results if u.check == "compile"] == not_traced and (not_traced or dtype != "float32")
    bad = [f"{u.id}: {v.outcome.value} {v.message}" for u, v in results
           if v.outcome is not Outcome.PASS and u not in not_traced]
    assert results and not bad, bad
    assert not [u for u, _ in results if u.check == "forward" and "sinks" in (u.case or "")]
    (sinks,) = [v.message for u, v in results if u.check == "dispatch" and u.case == "sinks"]
    assert "yet computed within tolerance: declare it (supports_sink())" in sinks


def test_a_replaced_layer_gets_its_ops_size_cases_and_the_one_past_int32_is_skipped_where_memory_is_short():
    """The demo's RMSNorm replacement is graded at the row counts where kernels break, like the rms_norm op (issue
    33): 4,097 and 65,537 rows at standard (bfloat16), with and without a residual, all PASS. At full the case past 2^31
    elements runs only where the machine has the memory it declares: asked here, not assumed (not run when it fits)."""
    from conformance.checks.common import memory_skip
    from conformance.checks import lookup
    from reference_impl.ir.size_cases import INT32_FLAG, ROWS_FLAG

    with plugin("demo", "conformance_demo.platform") as load:
        # its register_oot while the platform is activated, as the demo's general plugin does
        inventory = activate("demo", lambda: (importlib.import_module("conformance_demo.layers"),
                                              load().DemoPlatform())[1])
        ctx = CheckContext("demo", inventory.platform, seed=1234, level="full")
        units = inventory.layer_case_units("numerics", "layer_case", "standard")
        sized = [u for u in units if u.op == "rms_norm" and ROWS_FLAG in u.case]
        # 4,097 rows in every dtype, 65,537 in bfloat16 only (reference_impl.ir.size_cases.ONE_DTYPE_LIMITS)
        assert {u.dtype for u in sized if u.case.startswith("tokens=65537,")} == {"bfloat16"}
        sized = [u for u in sized if u.dtype == "bfloat16"]
        assert sorted(u.case.split(",")[0] for u in sized) == ["tokens=4097"] * 2 + ["tokens=65537"] * 2
        verdicts = [run_unit(ctx, u)[0] for u in sized]
        assert [v.outcome for v in verdicts] == [Outcome.PASS] * 4, [v.message for v in verdicts]
        full = inventory.layer_case_units("numerics", "layer_case", "full")
        [big] = [u for u in full if u.op == "rms_norm" and INT32_FLAG in u.case and "residual" not in u.case]
        assert big.dtype == "bfloat16"
        expected_skip = memory_skip(lookup.layer_case(big.op, big.case), ctx.device)
        if expected_skip is not None:
            verdict = run_unit(ctx, big)[0]
            assert verdict.outcome is Outcome.SKIP and verdict.message == expected_skip.message
            assert "free" in verdict.message
