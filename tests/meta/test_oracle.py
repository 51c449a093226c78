"""Unit tests of the oracle every numerics verdict and every kernel test goes through (in-process, fast)."""

from __future__ import annotations

import math

import pytest
import torch

from conformance.checks.common import compare_outputs
from conformance.judge.oracle import assert_matches_native, judge
from conformance.results.result import Outcome
from reference_impl import ir

HINT = "override(atol={atol:.2g}, rtol={rtol:g})"


def cmp(out, ref, golden=None, atol=1e-3, rtol=0.0, compare_nan=True, dtype=torch.float32):
    return compare_outputs(out, ref, golden, atol=atol, rtol=rtol, compare_nan=compare_nan, dtype=dtype,
                           tolerance_hint=HINT)


def test_equal_outputs_pass_with_zero_error():
    ref = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    c = cmp(ref.clone(), ref)
    assert c.outcome is Outcome.PASS and c.max_abs_err == 0.0


def test_tolerance_edge_is_inclusive_and_just_past_it_fails():
    ref = torch.zeros(3, dtype=torch.float64)
    assert cmp(ref + 1e-3, ref, atol=1e-3).outcome is Outcome.PASS
    c = cmp(ref + 1.5e-3, ref, atol=1e-3)
    assert c.outcome is Outcome.FAIL
    assert "3 of 3 elements outside atol=0.001" in c.message and c.max_abs_err == pytest.approx(1.5e-3)


def test_rtol_scales_with_native_magnitude():
    ref = torch.tensor([1000.0, 1.0])
    assert cmp(ref + torch.tensor([0.5, 0.0]), ref, atol=0.0, rtol=1e-3).outcome is Outcome.PASS
    assert cmp(ref + torch.tensor([0.0, 0.5]), ref, atol=0.0, rtol=1e-3).outcome is Outcome.FAIL


def test_nan_positions_must_match_when_compared():
    ref = torch.tensor([1.0, math.nan, 3.0])
    assert cmp(ref.clone(), ref).outcome is Outcome.PASS
    moved = torch.tensor([math.nan, 2.0, 3.0])
    c = cmp(moved, ref)
    assert c.outcome is Outcome.FAIL and "nan positions differ from native (2 elements); first at index (0,)" in c.message
    # where the op leaves NaN positions unspecified, only the other elements are compared
    assert cmp(torch.tensor([1.0, 7.0, 3.0]), ref, compare_nan=False).outcome is Outcome.PASS
    assert cmp(torch.tensor([1.0, math.nan, 3.0]), torch.tensor([1.0, 2.0, 3.0]), compare_nan=False).outcome is Outcome.FAIL


def test_infinities_must_be_reproduced_exactly():
    ref = torch.tensor([math.inf, -math.inf, 0.0])
    assert cmp(ref.clone(), ref).outcome is Outcome.PASS
    c = cmp(torch.tensor([math.inf, 1e30, 0.0]), ref)
    assert c.outcome is Outcome.FAIL and "native gives -inf at index (1,)" in c.message


def test_special_values_where_native_and_its_float64_run_disagree_are_judged_by_the_float64_run():
    """torch's fp32 gelu(+inf) is NaN on AVX-512 and +inf on AVX2: where native's special value differs from its
    float64 run's (rounded to the output dtype), the float64 value is the truth and the message says so."""
    native = torch.tensor([math.nan, 1.0, 2.0, math.inf])       # native's NaN at +inf's place
    golden = torch.tensor([math.inf, 1.0, 2.0, 1e300], dtype=torch.float64)   # 1e300 rounds to fp32's +inf
    c = cmp(torch.tensor([math.inf, 1.0, 2.0, math.inf]), native, golden)
    assert c.outcome is Outcome.PASS
    assert c.message == ("output: native differs from its float64 run in 1 special values (first at index (0,): "
                         "native nan, float64 inf): judged there against the float64 value, since native's special "
                         "values depend on the machine")
    c = cmp(native.clone() + torch.tensor([0.0, 0.0, 1.0, 0.0]), native, golden)   # native's NaN: wrong
    assert c.outcome is Outcome.FAIL and c.message.startswith("output: nan positions differ from native (1 elements")
    assert "judged there against the float64 value" in c.message
    # fp8 outputs keep native's values: float64 -> fp8 rounds out-of-range values to NaN, not to a saturated code
    ref8 = torch.tensor([448.0, 1.0]).to(torch.float8_e4m3fn)
    out8 = torch.tensor([448.0, 1.125]).to(torch.float8_e4m3fn)
    assert cmp(out8, ref8, torch.tensor([1000.0, 1.0], dtype=torch.float64), atol=0.2,
               dtype=torch.float8_e4m3fn).outcome is Outcome.PASS


def test_dtype_and_shape_must_equal_natives():
    ref = torch.zeros(2, 3)
    c = cmp(torch.zeros(2, 3, dtype=torch.float64), ref)
    assert c.outcome is Outcome.FAIL and "dtype is float64, native gives float32" in c.message
    c = cmp(torch.zeros(3, 2), ref)
    assert c.outcome is Outcome.FAIL and "shape is (3, 2), native gives (2, 3)" in c.message


def test_tuples_are_compared_element_by_element_and_structure_must_match():
    a, b = torch.zeros(2), torch.ones(2)
    assert cmp((a.clone(), b.clone()), (a, b)).outcome is Outcome.PASS
    c = cmp((a.clone(), b + 1), (a, b))
    assert c.outcome is Outcome.FAIL and c.message.startswith("output 1:")
    assert "returned a tuple of 1, native returns a tuple of 2" in cmp((a,), (a, b)).message
    assert "returned Tensor, native returns a tuple of 2" in cmp(a, (a, b)).message


def test_none_outputs_match_only_none():
    a = torch.zeros(2)
    assert cmp((a.clone(), None), (a, None)).outcome is Outcome.PASS
    c = cmp((a.clone(), a.clone()), (a, None))
    assert c.outcome is Outcome.FAIL and "output 1 is Tensor, native returns NoneType" in c.message
    c = cmp((a.clone(), None), (a, a))
    assert c.outcome is Outcome.FAIL and "output 1 is NoneType, native returns a Tensor" in c.message


def test_empty_outputs_pass():
    assert cmp(torch.zeros(0, 4), torch.zeros(0, 4)).outcome is Outcome.PASS


def test_golden_grading_warns_on_clearly_worse_results_within_tolerance():
    gold = torch.zeros(8, dtype=torch.float64)
    ref = torch.full((8,), 1e-5)
    worse = torch.full((8,), 9e-4)          # within atol of native, 90x native's error against float64
    c = cmp(worse, ref, gold, atol=1e-3)
    assert c.outcome is Outcome.QUALITY_WARNING and "clearly worse" in c.message


def test_fp8_outputs_are_compared_as_values():
    ref = torch.tensor([0.5, 1.0, -2.0]).to(torch.float8_e4m3fn)
    assert cmp(ref.clone(), ref, dtype=torch.bfloat16).outcome is Outcome.PASS
    c = cmp(torch.tensor([0.5, 1.0, 2.0]).to(torch.float8_e4m3fn), ref, dtype=torch.bfloat16)
    assert c.outcome is Outcome.FAIL


def test_judge_runs_native_on_copies_and_uses_the_ops_tolerance():
    op = ir.ops.rms_norm
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    w = torch.ones(8)
    args = (x, w, 1e-6, None)
    before = x.clone()
    good = op.native_fn(x.clone(), w, 1e-6, None)
    assert judge(op, args, good, torch.float32).outcome is Outcome.PASS
    assert torch.equal(x, before)
    atol, _ = op.get_tolerance(torch.float32)
    c = judge(op, args, good + 10 * atol, torch.float32)
    assert c.outcome is Outcome.FAIL and "ir.ops.rms_norm.override_tolerance" not in c.message[:20]
    with pytest.raises(AssertionError, match="^rms case: output: 24 of 24 elements outside"):
        assert_matches_native(op, args, good + 10 * atol, torch.float32, "rms case")


# ----- which rows are wrong ---------------------------------------------------------------------------
def _rms_case(rows: int, hidden: int = 8):
    op = ir.ops.rms_norm
    x = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(3))
    args = (x, torch.ones(hidden), 1e-6, None)
    return op, args, op.native_fn(*args)


def test_a_dropped_tail_of_rows_fails_naming_the_first_bad_row_and_the_run():
    """A kernel that stops at a row limit: every row from it on is zero, and the message says where that starts."""
    op, args, out = _rms_case(65537)
    out[4096:] = 0
    c = judge(op, args, out, torch.float32)
    assert c.outcome is Outcome.FAIL
    assert "(float32) in 61441 of 65537 rows, first bad row 4096 (rows 4096..65536 are all zero); worst at" in c.message


def test_scattered_bad_rows_are_counted_and_their_runs_named_in_order():
    ref = torch.ones(12, 4)
    out = ref.clone()
    out[1, 2] = 5.0        # one element of row 1
    out[3:6] = 0.0         # rows 3..5, all zero
    out[7] = 0.0           # row 7, all zero
    out[9, 0] = 2.0        # row 9
    out[11, 3] = 2.0       # row 11
    c = cmp(out, ref)
    assert c.outcome is Outcome.FAIL
    assert ("in 7 of 12 rows, first bad row 1 (row 1, rows 3..5 are all zero, row 7 is all zero and 2 more runs of "
            "bad rows)") in c.message


def test_bad_rows_count_the_leading_dims_flattened_and_name_all_nan_rows():
    ref = torch.ones(2, 3, 4)
    out = ref.clone()
    out[1, 1] = math.nan     # row 4 of the 6 (batch 1, position 1)
    c = cmp(out, ref)
    assert c.outcome is Outcome.FAIL
    assert "nan positions differ from native (4 elements in 1 of 6 rows, first bad row 4 (row 4 is all nan)); first at" \
        in c.message


def test_a_one_dim_output_has_no_rows_to_name():
    c = cmp(torch.tensor([1.0, 5.0]), torch.tensor([1.0, 1.0]))
    assert c.outcome is Outcome.FAIL and " rows" not in c.message


def test_rows_native_also_has_as_zero_are_not_called_all_zero():
    ref = torch.zeros(3, 4)
    ref[1] = 1.0
    out = torch.zeros(3, 4)
    out[2] = 3.0            # row 2: native zero, output not; row 1: output zero, native not
    c = cmp(out, ref)
    assert "in 2 of 3 rows, first bad row 1 (rows 1..2)" in c.message


# ----- the float64 grade is computed only where it can matter ---------------------------------------
def test_an_output_identical_to_native_passes_without_the_float64_run():
    op, args, out = _rms_case(64)
    calls = []
    real = op.native_fn

    class Spy:
        name, param_names = op.name, op.param_names
        get_tolerance = staticmethod(op.get_tolerance)

        @staticmethod
        def native_fn(*a):
            calls.append(a[0].dtype)
            return real(*a)

    c = judge(Spy, args, out.clone(), torch.float32)
    assert c.outcome is Outcome.PASS and c.max_abs_err == 0.0 and c.err_to_tol == 0.0
    assert calls == [torch.float32], "only native ran, no float64 run"
    calls.clear()
    out[0, 0] += 1e-6
    assert judge(Spy, args, out, torch.float32).outcome is Outcome.PASS
    assert calls == [torch.float32, torch.float64], "an output that differs is graded against float64"


def test_the_float64_grade_takes_the_same_maxima_as_indexing_the_finite_elements_out():
    """golden_errors masks instead of indexing; the maxima are those of the elements the mask selects."""
    from conformance.judge.comparison import golden_errors

    gen = torch.Generator().manual_seed(5)
    gold = torch.randn(200, generator=gen, dtype=torch.float64) * 10
    b = gold + torch.randn(200, generator=gen, dtype=torch.float64) * 1e-3
    a = gold + torch.randn(200, generator=gen, dtype=torch.float64) * 1e-2
    gold[3], b[5], a[7], a[8] = math.nan, math.inf, math.nan, 1e9
    mask = torch.ones(200, dtype=torch.bool)
    mask[8] = False                                 # the huge error sits outside the mask
    errs = golden_errors(a, b, gold, mask, 1e-3, torch.float32)
    m = mask & torch.isfinite(gold) & torch.isfinite(b)
    ea, eb, g = (a[m] - gold[m]).abs(), (b[m] - gold[m]).abs(), gold[m]
    assert errs.impl_abs == math.inf                # a nan output where float64 is finite
    assert errs.native_abs == float(eb.max())
    big = g.abs() > 1e-3
    assert errs.native_rel == float((eb[big] / g[big].abs()).max())
    assert errs.impl_rel == math.inf
    ea = torch.where(torch.isnan(ea), math.inf, ea)
    assert errs.ulp_abs > 0 and float(ea.max()) == errs.impl_abs
