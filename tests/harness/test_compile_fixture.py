"""The compile family end to end on the built-in cpu platform: every provider passes.

Its fixture fault, `broken_traced_branch` (a Python-side value branch that goes another way when
traced), is exercised with the other faults in tests/harness/test_harness_fixtures.py.
"""

from __future__ import annotations

from harness_runner import run_harness


def test_compile_family_passes_on_the_builtin_cpu_platform(tmp_path):
    run = run_harness(tmp_path, "cpu", "-k", "compile")
    assert run.doc is not None, run.output[-3000:]
    compile_results = run.where(check="compile")
    assert compile_results, run.output[-3000:]
    assert run.returncode == 0 and run.doc["verdict"] == "CONFORMANT", run.output[-3000:]
    assert {r["outcome"] for r in compile_results} <= {"PASS", "NOT_SUPPORTED"}
    for op in ("rms_norm", "fused_add_rms_norm"):
        assert run.outcomes(check="compile", op=op, provider="cpp") == {"PASS"}, op
