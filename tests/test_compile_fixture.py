"""The compile family end to end: passes on the built-in cpu platform, and catches the
`broken_traced_branch` fixture (a kernel whose Python-side value branch goes another way when traced)
that every eager family passes.
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


def test_compile_family_catches_a_kernel_that_behaves_differently_when_traced(tmp_path):
    run = run_harness(tmp_path, "broken_traced_branch", "-k",
                      "rms_norm and float32 and (compile or numerics) and not fused", dist="broken")
    assert run.doc is not None, run.output[-3000:]
    assert run.returncode != 0 and run.doc["verdict"] == "NOT_CONFORMANT"
    assert run.outcomes(check="compile", op="rms_norm", provider="broken") == {"FAIL"}
    failure, = run.where(check="compile", provider="broken")
    assert "compiled result differs from eager" in failure["message"]
    assert run.outcomes(check="numerics", op="rms_norm", provider="broken") == {"PASS"}   # eager is right
