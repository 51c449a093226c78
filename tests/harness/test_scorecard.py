"""Scorecard and report in-process: cause hints, collapsed coverage, counts as pytest counts, run banners."""

from __future__ import annotations

import pytest

from conformance.judge.hints import case_traits, cause_hint
from conformance.report.scorecard import pytest_counts, render_markdown, render_scorecard, scorecard_rows, verdict_text
from conformance.results.result import CheckResult, Outcome, RunInfo, Selection

DTYPES = ("float32", "float16", "bfloat16")
NORM_CASES = ("tokens=1,hidden=128", "tokens=7,hidden=769", "tokens=5,hidden=1000,row_strided",
              "tokens=7,hidden=769,strided", "tokens=4,hidden=256,no_weight", "tokens=4,hidden=256,variance_size=100",
              "batch=2,seq=3,hidden=96", "tokens=3,hidden=512,tiny", "tokens=2,hidden=64,zeros",
              "tokens=3,hidden=127,prime")


def _r(case, outcome, dtype="float32", family="numerics", op="rms_norm", provider="p", test="test_ir_case"):
    return CheckResult(f"suites/test_{family}.py::{test}[{op}-{provider}-{dtype}-{case}]", family, op, provider, dtype,
                       case, Outcome(outcome), None if outcome == "PASS" else f"{outcome} here")


def _numerics(fails, op="rms_norm", cases=NORM_CASES) -> list[CheckResult]:
    """Every case (the norm cases by default) in every dtype; those for which fails(case, dtype) is true FAIL."""
    return [_r(c, "FAIL" if fails(c, d) else "PASS", d, op=op) for c in cases for d in DTYPES]


def test_case_traits_come_from_the_declared_case_names():
    assert case_traits("tokens=3,hidden=512,tiny") == {"tiny"}
    assert case_traits("tokens=7,hidden=769,strided") == {"strided", "odd", "tail"}
    assert case_traits("tokens=5,d=100,strided") == {"strided", "tail"}
    assert case_traits("tokens=1,hidden=128") == {"one_row"}
    assert case_traits("tokens=4,hidden=256,variance_size=100") == {"variance_size"}
    assert case_traits("tokens=6,heads=2/2,head=64,row_strided,gptj") == {"row_strided", "gptj"}


@pytest.mark.parametrize("fails, fragments", [
    (lambda c, d: "tiny" in c, ["only tiny magnitudes fail", "epsilon"]),
    (lambda c, d: "tiny" in c or "zeros" in c, ["only tiny magnitudes and all-zero inputs fail", "epsilon"]),
    (lambda c, d: "hidden=769" in c or "127" in c, ["only odd sizes fail", "tail"]),
    (lambda c, d: c.endswith(",strided"), ["only non-contiguous last dimension (strided cases) fail"]),
    (lambda c, d: "strided" in c, ["only strided layouts fail"]),
    (lambda c, d: d == "float16", ["only float16 fails", "other dtypes pass"]),
    (lambda c, d: "tiny" in c and d == "bfloat16", ["only tiny magnitudes fail, only in bfloat16"]),
    (lambda c, d: True, ["every case fails", "wrong formula", "swapped outputs"]),
])
def test_cause_hint_names_what_the_failing_cases_share(fails, fragments):
    hint = cause_hint(_numerics(fails))
    assert hint is not None
    for fragment in fragments:
        assert fragment in hint, hint


@pytest.mark.parametrize("op, cause, not_cause", [
    ("rms_norm", "scale before squaring", "rotate"),
    ("rotary_embedding", "rotate in float32 and round once", "squaring"),
    ("static_quant_fp8", "absmax or x/scale", "squaring"),
    ("silu_and_mul", "exp or tanh overflows at large |gate|", "squaring"),
])
def test_the_large_magnitude_hint_depends_on_what_the_op_does(op, cause, not_cause):
    hint = cause_hint(_numerics(lambda c, d: "large" in c, op=op, cases=NORM_CASES + ("tokens=3,hidden=512,large",)))
    assert hint.startswith("only large magnitudes fail") and cause in hint and not_cause not in hint, hint


def test_no_hint_without_a_pattern_or_without_failures():
    assert cause_hint(_numerics(lambda c, d: False)) is None
    scattered = {("tokens=1,hidden=128", "float32"), ("tokens=7,hidden=769", "float16"),
                 ("tokens=4,hidden=256,no_weight", "bfloat16")}
    assert cause_hint(_numerics(lambda c, d: (c, d) in scattered)) is None


def test_compile_only_failure_is_named():
    results = _numerics(lambda c, d: False) + [_r(None, "FAIL", d, family="compile", test="test_ir_compile")
                                               for d in DTYPES]
    assert "only the compiled program fails" in cause_hint(results)


def _platform_results() -> list[CheckResult]:
    brought = _numerics(lambda c, d: "tiny" in c)
    not_impl = [CheckResult(f"suites/test_dispatch.py::test_coverage[{op}]", "dispatch", op, None, None, None,
                            Outcome.NOT_IMPLEMENTED, "native runs") for op in ("silu_and_mul", "gelu_new")]
    layers = [CheckResult(f"suites/test_dispatch.py::test_layer_coverage[{name}]", "dispatch", name, None, None,
                          None, Outcome.NOT_IMPLEMENTED, "forward_native runs") for name in ("silu_and_mul", "rms_norm")]
    return brought + not_impl + layers


def test_scorecard_keeps_rows_for_what_the_platform_brings_and_one_line_for_the_rest():
    results = _platform_results()
    _, rows = scorecard_rows(results)
    assert [row[:2] for row in rows] == [["rms_norm", "p"]]
    run = RunInfo("quick", 1, expected_results=len(results)).to_json(len(results), True)
    text = render_scorecard(results, platform="p (m.P)", run=run)
    assert "1NI" not in text
    assert "CustomOp layers not replaced (forward_native runs, nothing to check): 2: rms_norm, silu_and_mul" in text
    assert "coverage: 1 / 3 IR ops implemented (rms_norm); native fallback: 2" in text
    assert "cause hint: only tiny magnitudes fail" in text
    assert "verdict: NOT_CONFORMANT" in text and "INCOMPLETE" not in text and "PARTIAL" not in text


def test_results_line_counts_what_pytest_counts():
    results = [_r("a", o) for o in ("PASS", "QUALITY_WARNING", "NOT_IMPLEMENTED", "NOT_SUPPORTED", "SKIP", "XFAIL",
                                    "XPASS", "FAIL", "ERROR", "TIMEOUT", "CRASH")]
    assert pytest_counts(results) == {"failed": 5, "passed": 2, "skipped": 3, "xfailed": 1}


def test_an_incomplete_or_narrowed_run_never_shows_a_plain_conformant():
    assert verdict_text("CONFORMANT", True, False) == "CONFORMANT"
    for complete, partial in ((False, False), (False, True), (True, True)):
        assert verdict_text("CONFORMANT", complete, partial) != "CONFORMANT"
    assert "INCOMPLETE" in verdict_text("CONFORMANT", False, False)
    assert "PARTIAL SELECTION" in verdict_text("CONFORMANT", True, True)
    passing = [_r("c", "PASS")]
    narrowed = RunInfo("quick", 1, Selection(partial=True, keyword="rms"), 1).to_json(1, True)
    text = render_scorecard(passing, platform="p", run=narrowed)
    assert "!!! PARTIAL SELECTION (-k 'rms')" in text
    assert "verdict: CONFORMANT FOR THE SELECTED CHECKS ONLY" in text
    killed = RunInfo("quick", 1, expected_results=9).to_json(1, False)
    text = render_scorecard(passing, platform="p", run=killed)
    assert "!!! INCOMPLETE: 1 of 9 expected results written" in text
    assert "verdict: NOT_CONFORMANT (INCOMPLETE" in text


def test_markdown_report_of_an_incomplete_file_says_so():
    results = _platform_results()
    doc = {"schema_version": 1, "platform": {"name": "p", "class": "m.P", "device_type": "cpu"},
           "environment": {"python": "3.11", "torch": "2.13.0", "reference_impl": "0.1.0", "seed": 1,
                           "triton": None, "device_name": "X", "driver": None,
                           "plugin": {"distribution": "vendor-plugin", "version": "2.0"}},
           "run": RunInfo("standard", 1, expected_results=500).to_json(len(results), False),
           "results": [r.to_json() for r in results], "summary": {}, "verdict": "NOT_CONFORMANT"}
    text = render_markdown(doc)
    assert f"> **INCOMPLETE: {len(results)} of 500 expected results written" in text
    assert "**NOT_CONFORMANT (INCOMPLETE run" in text
    assert "plugin vendor-plugin 2.0" in text and "device X" in text
    assert (f"- coverage so far: 1 IR ops implemented (rms_norm); native fallback: 2 (INCOMPLETE run: {len(results)} "
            "of 500 planned results written; counted over those, ops and layers the run did not reach are missing)"
            in text)
    assert "## Cause hints" in text and "only tiny magnitudes fail" in text


def test_coverage_of_an_incomplete_run_says_what_was_planned_and_never_reads_as_full():
    """A run killed after one result must not say '1 / 1 IR ops implemented' (it reads as complete coverage)."""
    one = [_r("c", "PASS")]
    killed = RunInfo("standard", 1, expected_results=1582).to_json(1, False)
    text = render_scorecard(one, platform="p", ir_ops=["rms_norm", "silu_and_mul", "gelu_new"], run=killed)
    (line,) = [ln for ln in text.splitlines() if ln.startswith("coverage")]
    assert line == ("coverage so far: 1 IR ops implemented of the 3 in the catalog (rms_norm); native fallback: 0 "
                    "(INCOMPLETE run: 1 of 1582 planned results written; counted over those, ops and layers the run "
                    "did not reach are missing)")
    assert "1 / 1" not in render_markdown({"platform": {"name": "p", "class": "m.P", "device_type": "cpu"},
                                           "environment": {"python": "3", "torch": "2", "reference_impl": "0",
                                                           "seed": 1}, "run": killed,
                                           "results": [r.to_json() for r in one], "summary": {"PASS": 1},
                                           "verdict": "NOT_CONFORMANT"})
    full = RunInfo("standard", 1, expected_results=1).to_json(1, True)
    assert "coverage: 1 / 3 IR ops implemented (rms_norm)\n" in render_scorecard(
        one, platform="p", ir_ops=["rms_norm", "silu_and_mul", "gelu_new"], run=full) + "\n"


def test_markdown_findings_give_one_line_for_checks_not_run_after_a_hang():
    hung = [_r(c, "TIMEOUT") for c in ("a", "b")]
    not_run = [CheckResult(f"x::test_ir_case[{c}]", "numerics", "rms_norm", "p", "float32", c, Outcome.SKIP,
                           "not run: provider p of op rms_norm hung in numerics.ir_case [a] earlier (2 TIMEOUT "
                           "results); skipped rather than waiting out the time limit again (its own outcome was not "
                           "observed)") for c in "cdef"]
    results = hung + not_run
    doc = {"schema_version": 1, "platform": {"name": "p", "class": "m.P", "device_type": "cpu"},
           "environment": {"python": "3.11", "torch": "2.13.0", "reference_impl": "0.1.0", "seed": 1},
           "run": RunInfo("quick", 1, expected_results=6).to_json(6, True),
           "results": [r.to_json() for r in results], "summary": {"TIMEOUT": 2, "SKIP": 4},
           "verdict": "NOT_CONFORMANT"}
    text = render_markdown(doc)
    assert text.count("- **TIMEOUT** `") == 2
    assert "- **SKIP** x4 `rms_norm` (provider `p`): not run, because a provider they need hung or crashed" in text
