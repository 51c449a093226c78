"""The harness against its fixture plugins: each fault reported by the right family, demo conformant."""

from __future__ import annotations

import pytest

from conformance.results import validate_document
from harness_runner import run_harness

BLOCKING = {"FAIL", "ERROR", "CRASH", "TIMEOUT", "XPASS"}


def _assert_valid(run):
    assert run.doc is not None, run.output[-3000:]
    assert validate_document(run.doc) == []
    for r in run.results:
        if r["outcome"] != "PASS":
            assert r["message"] and r["repro"].startswith("python -m conformance repro"), r


def test_demo_plugin_is_conformant_without_false_positives(tmp_path):
    run = run_harness(tmp_path, "demo", dist="demo")
    _assert_valid(run)
    assert run.returncode == 0, run.output[-3000:]
    assert run.doc["verdict"] == "CONFORMANT"
    assert run.doc["platform"] == {"name": "demo", "class": "conformance_demo.platform.DemoPlatform",
                                   "device_type": "cpu"}
    assert not {r["outcome"] for r in run.results} & (BLOCKING | {"QUALITY_WARNING"})
    for family in ("numerics", "aliasing", "dispatch"):
        for op in ("rms_norm", "fused_add_rms_norm"):
            assert run.outcomes(check=family, op=op, provider="demo") == {"PASS"}, (family, op)
    assert run.outcomes(check="numerics", provider="DemoRMSNorm") == {"PASS"}
    assert run.outcomes(check="dispatch", provider="DemoRMSNorm") == {"PASS"}
    assert run.outcomes(check="dispatch", op="silu_and_mul") == {"NOT_IMPLEMENTED"}
    assert "CONFORMANT" in run.output and "conformance scorecard" in run.output
    assert "IR providers brought: rms_norm: demo; fused_add_rms_norm: demo" in run.output
    assert "RMSNorm -> conformance_demo.layers.DemoRMSNorm" in run.output


# fixture -> (pytest selection, family, outcome, message fragment or alternatives, whether a clean result
# must also show)
FAULTS = {
    "odd_numerics": (["-k", "numerics and rms_norm and float32"], "numerics", "FAIL", "hidden=769", True),
    "strides": (["-k", "numerics and float32 and ir_case"], "numerics", "FAIL", "strided", True),
    "wrong_dtype": (["-k", "numerics and bfloat16 and ir_case"], "numerics", "FAIL",
                    "dtype is float32, native gives bfloat16", False),
    "mutates_input": (["-k", "float32 and ir_case and not compile"], "aliasing", "FAIL",
                      "input 'x' was modified", True),
    "writes_weight": (["-k", "aliasing and float32"], "aliasing", "FAIL", "'weight'", False),
    "returns_input": (["-k", "aliasing and float32"], "aliasing", "FAIL", "shares storage with input 'x'", False),
    "batch_guard": (["-k", "dispatch"], "dispatch", "FAIL", "depends on the batch size", True),
    "nonbool_supports": (["-k", "dispatch"], "dispatch", "FAIL", "not a Python bool", False),
    "oot_name": (["-k", "dispatch"], "dispatch", "FAIL", "matches no in-tree CustomOp class", False),
    "missing_default": (["-k", "dispatch and defaults"], "dispatch", "FAIL", "'fastnorm', which is not registered",
                        True),
    "raises": (["-k", "numerics and float32 and ir_case"], "numerics", "ERROR", "launch failed", False),
    "hangs": (["--conformance-timeout=3", "-k", "float32 and ir_case and 128 and not 1280 or coverage"],
              "numerics", "TIMEOUT", "per-check limit of 3 s", False),
    "segfault": (["-k", "float32 and ir_case and 128 and not 1280 or coverage"], "numerics", "CRASH",
                 "SIGSEGV", False),
    # Depending on the torch version, is_compiling() steers the trace (wrong result) or the value read
    # raises a data-dependent guard while lowering (2.11): a compile FAIL either way.
    "traced_branch": (["-k", "rms_norm and float32 and (compile or numerics) and not fused"], "compile", "FAIL",
                      ("compiled result differs from eager", "branches on tensor values while traced"), True),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_broken_plugin_is_caught_by_the_right_family(tmp_path, fault):
    selection, family, outcome, fragment, clean_too = FAULTS[fault]
    run = run_harness(tmp_path, f"broken_{fault}", *selection, dist="broken")
    _assert_valid(run)
    assert run.returncode != 0
    assert run.doc["verdict"] == "NOT_CONFORMANT"
    assert "verdict: NOT_CONFORMANT" in run.output
    fragments = fragment if isinstance(fragment, tuple) else (fragment,)
    hits = [r for r in run.where(check=family, outcome=outcome)
            if any(f in (r["message"] + (r["case"] or "")) for f in fragments)]
    assert hits, f"no {family} {outcome} mentioning {fragment!r}:\n" + "\n".join(
        f"{r['check']} {r['outcome']} {r['case']}: {(r['message'] or '')[:200]}" for r in run.results)
    if clean_too:   # the fault is specific: something else of the same run passes
        assert "PASS" in {r["outcome"] for r in run.results}
    if fault in ("mutates_input", "traced_branch"):   # eager values are right: numerics must not blame it
        assert run.outcomes(check="numerics") == {"PASS"}
    if fault in ("hangs", "segfault"):   # the run went on past the dead worker, to the end
        assert len(run.where(outcome=outcome)) >= 2   # aliasing and numerics: a fresh worker after each
        assert run.outcomes(check="dispatch") == {"NOT_IMPLEMENTED"}
        assert "conformance scorecard" in run.output
