"""The HTML/markdown report of one or several results files: contents, escaping, self-containment, CLI formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conformance.cli import main
from conformance.report.html import render_html, render_markdown
from conformance.report.scorecard import render_markdown as file_markdown
from conformance.report.view import platform_view, verdict_label
from reference_impl.ir.op import IrOp

ROOT = Path(__file__).resolve().parent.parent


def _r(op, outcome="PASS", check="numerics", test="test_ir_case", provider="p", dtype="float32", case="c1",
       abs_err=None, rel_err=None, message=None):
    return {"nodeid": f"suites/test_{check}.py::{test}[{op}-{provider}-{dtype}-{case}]", "check": check, "op": op,
            "provider": provider, "dtype": dtype, "case": case, "outcome": outcome,
            "message": message or (None if outcome == "PASS" else f"{outcome} message"),
            "max_abs_err": abs_err, "max_rel_err": rel_err,
            "repro": f"python -m conformance repro --op {op}", "duration_s": 0.01}


def _doc(name, results, verdict="CONFORMANT", run=None, env_extra=None):
    doc = {"schema_version": 1, "platform": {"name": name, "class": f"{name}.Plat", "device_type": "cpu"},
           "environment": {"python": "3.11.7", "torch": "2.13.0", "reference_impl": "0.1.0", "seed": 5,
                           **(env_extra or {})},
           "results": results, "summary": {}, "verdict": verdict}
    if run:
        doc["run"] = run
    return doc


def _coverage(op, outcome="NOT_IMPLEMENTED"):
    return _r(op, outcome, check="dispatch", test="test_coverage", provider=None, dtype=None, case=None)


A = _doc("alpha", [
    _r("rms_norm", abs_err=2e-6, rel_err=1e-7),
    _r("rms_norm", "FAIL", case="c2", abs_err=0.5, rel_err=0.2, message="max abs err 0.5 <script>x()</script>"),
    _r("rms_norm", "NOT_SUPPORTED", case="c3"),
    _coverage("silu_and_mul"),
    _r("rms_norm", "PASS", check="dispatch", test="test_runs", dtype=None, case=None),
    _r("rms_norm", "NOT_IMPLEMENTED", check="dispatch", test="test_layer_coverage", provider=None, dtype=None,
       case=None),
], "NOT_CONFORMANT", env_extra={"device_name": "Widget 9000", "driver": None, "triton": "3.6.0",
                                "plugin": {"distribution": "alpha-plugin", "version": "1.2"}})
B = _doc("beta", [_r("rms_norm", abs_err=1e-6, rel_err=1e-7, provider="b"),
                  _r("silu_and_mul", provider="b", abs_err=0.0, rel_err=0.0)])


def test_heatmap_cell_has_worst_outcome_and_error_to_tolerance_ratio():
    atol, rtol = IrOp.registry["rms_norm"].get_tolerance(torch.float32)
    view = platform_view("alpha", A)
    assert view.columns == [("numerics", "float32"), ("dispatch", "-")]
    (label, provider, cells), = [row for row in view.heatmap if row[0] == "rms_norm"]
    cell = cells[0]
    assert (provider, cell.outcome.value) == ("p", "FAIL")
    assert cell.ratio == pytest.approx(min(0.5 / atol, 0.2 / rtol))
    assert cell.counts == {"FAIL": 1, "NOT_SUPPORTED": 1, "PASS": 1}
    assert "o-fail" in cell.css and "some-not-judged" in cell.css
    assert [c.result.case for c in view.worst] == ["c2"]
    assert view.coverage == {"implemented": ["rms_norm (p)"], "fallback": ["silu_and_mul"], "replaced": [],
                             "not_replaced": ["rms_norm"]}
    env = dict(view.environment)
    assert (env["device name"], env["driver"], env["triton"], env["plugin"]) == ("Widget 9000", "unknown", "3.6.0",
                                                                               "alpha-plugin 1.2")


def test_passing_results_never_show_beyond_their_tolerance():
    atol, _ = IrOp.registry["rms_norm"].get_tolerance(torch.float32)
    doc = _doc("x", [_r("rms_norm", abs_err=30 * atol, rel_err=None)])     # rtol-limited large values
    (_, _, cells), = platform_view("x", doc).heatmap
    assert cells[0].ratio == 1.0 and cells[0].text == "1"


def test_unknown_op_shows_the_absolute_error():
    (_, _, cells), = platform_view("x", _doc("x", [_r("no_such_op", abs_err=0.25)])).heatmap
    assert cells[0].ratio is None and cells[0].text == "abs 2.5e-01"


def test_html_is_self_contained_and_escapes_every_plugin_string():
    hostile = _doc("<b>evil</b>", [_r("rms_norm", "FAIL", provider="p</td><td>", message="<script>alert(1)</script>")],
                   "NOT_CONFORMANT")
    html = render_html([("a.json", A), ("h.json", hostile)])
    for needle in ("<script", "<link", "@import", "url(", "http://", "https://", "<img", "<iframe"):
        assert needle not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;b&gt;evil&lt;/b&gt;" in html
    assert "p&lt;/td&gt;&lt;td&gt;" in html
    assert "default-src 'none'" in html      # and the page forbids scripts and fetches outright


def test_several_files_add_a_compatibility_matrix():
    html = render_html([("a.json", A), ("b.json", B)])
    assert "Compatibility matrix" in html and "Conformance reports: alpha, beta" in html
    md = render_markdown([("a.json", A), ("b.json", B)])
    assert "| op | `alpha` | `beta` |" in md
    assert "| rms_norm | 2/3 FAIL | 1/1 |" in md             # PASS of judged results, worst outcome named
    assert "| silu_and_mul | native | 1/1 |" in md
    assert "| rms_norm (CustomOp) | native | - |" in md
    assert "| **ops fully passing** | 0/1 | 2/2 |" in md
    assert file_markdown(A) in md and file_markdown(B) in md
    assert render_markdown([("a.json", A)]) == file_markdown(A)   # one file: the markdown report as before
    assert "Compatibility matrix" not in render_html([("a.json", A)])


def test_same_platform_twice_is_told_apart_by_file_name():
    html = render_html([("runs/old.json", B), ("runs/new.json", B)])
    assert "beta (old.json)" in html and "beta (new.json)" in html


@pytest.mark.parametrize("run, text, css", [
    ({"complete": False, "written_results": 3, "expected_results": 9, "selection": {}},
     "NOT_CONFORMANT (INCOMPLETE run: no verdict on the platform): INCOMPLETE: 3 of 9 expected results written; "
     "the run did not finish", "v-bad"),
    ({"complete": True, "selection": {"partial": True, "keyword": "rms", "shard": None}},
     "CONFORMANT FOR THE SELECTED CHECKS ONLY (PARTIAL SELECTION: not a verdict on the platform): PARTIAL SELECTION "
     "(-k 'rms'): the verdict covers the selected checks only", "v-partial"),
    ({"complete": True, "selection": {"partial": False}}, "CONFORMANT", "v-good"),
    (None, "NOT_CONFORMANT (INCOMPLETE run: no verdict on the platform): INCOMPLETE: the file has no run block, so "
           "nothing says what it covers", "v-bad"),
])
def test_verdict_is_never_plain_conformant_for_incomplete_or_narrowed_runs(run, text, css):
    doc = _doc("x", [], "NOT_CONFORMANT" if not (run or {}).get("complete") else "CONFORMANT", run=run)
    assert verdict_label(doc) == (text, css)


def test_report_cli_picks_the_format_by_suffix(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(A))
    b.write_text(json.dumps(B))
    assert main(["report", str(a), str(b), "-o", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(a), "-o", str(tmp_path / "r.md")]) == 0
    assert (tmp_path / "r.md").read_text() == file_markdown(A)
    assert main(["report", str(a), str(b)]) == 0
    assert capsys.readouterr().out.startswith("# Compatibility reports")
    assert main(["report", str(a), "-o", str(tmp_path / "r.pdf")]) == 4
    assert main(["report", str(tmp_path / "missing.json")]) == 4
    err = capsys.readouterr().err
    assert "cannot tell the report format" in err and "missing.json: no such results file" in err


def test_published_cpu_reports_are_rendered_from_the_published_results():
    doc = json.loads((ROOT / "reports" / "cpu.json").read_text())
    assert (ROOT / "reports" / "cpu.md").read_text() == file_markdown(doc)
    assert (ROOT / "reports" / "cpu.html").read_text() == render_html([("reports/cpu.json", doc)])


def test_tolerances_come_from_the_op_the_layer_or_the_model():
    from conformance.checks.model import MODEL_TOLERANCES
    from conformance.judge.tolerances import tolerance
    from reference_impl.layers.cases import conformance_of
    from reference_impl.layers.layernorm import RMSNorm

    assert tolerance("numerics", "rms_norm", "bfloat16", False) == IrOp.registry["rms_norm"].get_tolerance(
        torch.bfloat16)
    assert tolerance("numerics", "rms_norm", "float16", True) == conformance_of(RMSNorm).get_tolerance(torch.float16)
    assert tolerance("model", "decoder", "float32", False) == MODEL_TOLERANCES[torch.float32]
    assert tolerance("numerics", "no_such_op", "float32", False) is None
    assert tolerance("numerics", "rms_norm", "no_such_dtype", False) is None
