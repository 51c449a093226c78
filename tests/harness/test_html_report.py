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

ROOT = Path(__file__).resolve().parents[2]


def _r(op, outcome="PASS", check="numerics", test="test_ir_case", provider="p", dtype="float32", case="c1",
       abs_err=None, rel_err=None, message=None, ratio=None):
    r = {"nodeid": f"suites/test_{check}.py::{test}[{op}-{provider}-{dtype}-{case}]", "check": check, "op": op,
         "provider": provider, "dtype": dtype, "case": case, "outcome": outcome,
         "message": message or (None if outcome == "PASS" else f"{outcome} message"),
         "max_abs_err": abs_err, "max_rel_err": rel_err,
         "repro": f"python -m conformance repro --op {op}", "duration_s": 0.01}
    if ratio is not None:
        r["err_to_tol"] = ratio
    return r


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
    _r("rms_norm", abs_err=2e-6, rel_err=1e-7, ratio=0.31),
    _r("rms_norm", "FAIL", case="c2", abs_err=0.5, rel_err=0.2, ratio=200.1234,
       message="max abs err 0.5 <script>x()</script>; The worst error is 200.1x the tolerance"),
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
    view = platform_view("alpha", A)
    assert view.columns == [("numerics", "float32"), ("dispatch", "-")]
    (label, provider, cells), = [row for row in view.heatmap if row[0] == "rms_norm"]
    cell = cells[0]
    assert (provider, cell.outcome.value) == ("p", "FAIL")
    assert cell.ratio == 200.1234 and cell.text == "200" and "worst error / tolerance 200.1" in cell.title
    assert cell.counts == {"FAIL": 1, "NOT_SUPPORTED": 1, "PASS": 1}
    assert "o-fail" in cell.css and "some-not-judged" in cell.css
    assert [c.result.case for c in view.worst] == ["c2"]
    assert view.coverage == {"implemented": ["rms_norm (p)"], "fallback": ["silu_and_mul"], "replaced": [],
                             "not_replaced": ["rms_norm"], "not_covered": [], "upstream": []}
    env = dict(view.environment)
    assert (env["device name"], env["driver"], env["triton"], env["plugin"]) == ("Widget 9000", "unknown", "3.6.0",
                                                                               "alpha-plugin 1.2")


def test_err_to_tol_is_the_number_the_message_quotes_in_every_report():
    """One ratio, computed by the check: the message's 'Nx the tolerance', the results file's err_to_tol, the
    HTML worst-cases column and the markdown findings all print 200.1 (no second formula re-derived later)."""
    (fail,) = platform_view("alpha", A).worst
    assert fail.ratio_text == "200.1" and "200.1x the tolerance" in fail.result.message
    html = render_html([("a.json", A)])
    assert '<td class="num">200.1</td>' in html
    assert "`suites/test_numerics.py::test_ir_case[rms_norm-p-float32-c2]` (err / tol 200.1):" in file_markdown(A)


def test_a_file_without_err_to_tol_shows_the_absolute_error():
    """Files written before err_to_tol existed: the report shows the plain error, it does not estimate a ratio."""
    (_, _, cells), = platform_view("x", _doc("x", [_r("rms_norm", abs_err=0.25, rel_err=0.1)])).heatmap
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
    assert "Compatibility matrix" in html and "Conformance reports: cpu device: alpha, " in html
    md = render_markdown([("a.json", A), ("b.json", B)])
    assert ("| op | `alpha, plugin alpha-plugin 1.2, alpha.Plat, Widget 9000` | `beta, beta.Plat` |" in md)
    assert "| rms_norm | 2/3 FAIL | 1/1 |" in md             # PASS of judged results, worst outcome named
    assert "| silu_and_mul | native | 1/1 |" in md
    assert "| rms_norm (CustomOp) | native | - |" in md
    assert "| **ops fully passing** | 0/1 | 2/2 |" in md
    first, _, rest = file_markdown(A).partition("\n")
    assert f"{first}: alpha, plugin alpha-plugin 1.2, alpha.Plat, Widget 9000\n{rest}" in md
    first, _, rest = file_markdown(B).partition("\n")
    assert f"{first}: beta, beta.Plat\n{rest}" in md
    assert render_markdown([("a.json", A)]) == file_markdown(A)   # one file: the markdown report as before
    assert "Compatibility matrix" not in render_html([("a.json", A)])


def test_same_platform_twice_is_told_apart_by_file_name():
    html = render_html([("runs/old.json", B), ("runs/new.json", B)])
    assert "Conformance reports: beta, beta.Plat, cpu device: old.json vs new.json" in html


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


def test_error_to_tolerance_is_the_worst_elements_share_of_its_own_tolerance():
    """Per element |out - native| / (atol + rtol*|native|): not min(max abs / atol, max rel / rtol), which mixes
    two different elements' errors (the vendor saw 228 in the report against 200.1x in the message)."""
    from conformance.judge.tolerances import error_to_tolerance

    native = torch.tensor([1000.0, 0.0, 2.0], dtype=torch.float64)
    out = torch.tensor([1001.0, 0.02, 2.0], dtype=torch.float64)
    diff, everywhere = (out - native).abs(), torch.ones(3, dtype=torch.bool)
    atol, rtol = 1e-3, 1e-3
    # element 0: 1 / (1e-3 + 1) ~ 0.999; element 1: 0.02 / 1e-3 = 20 (the worst); the mixed estimate would say
    # min(1 / 1e-3, 1e-3 / 1e-3) = 1
    assert error_to_tolerance(diff, native, atol, rtol, everywhere) == pytest.approx(20.0)
    assert error_to_tolerance(diff, native, atol, rtol, torch.tensor([True, False, True])) == pytest.approx(1 / 1.001)
    assert error_to_tolerance(diff, native, atol, rtol, torch.zeros(3, dtype=torch.bool)) == 0.0


def test_the_message_and_the_result_carry_the_same_ratio():
    from conformance.judge.comparison import compare_outputs
    from conformance.judge.tolerances import ratio_text

    native = torch.tensor([1000.0, 0.0, 2.0])
    cmp = compare_outputs(torch.tensor([1001.0, 0.02, 2.0]), native, None, atol=1e-3, rtol=1e-3, compare_nan=True,
                          dtype=torch.float32, tolerance_hint="x.override_tolerance(atol={atol}, rtol={rtol})")
    assert cmp.outcome.value == "FAIL" and cmp.err_to_tol == pytest.approx(20.0, rel=1e-3)
    assert f"The worst error is {ratio_text(cmp.err_to_tol)}x the tolerance" in cmp.message
    ok = compare_outputs(native + 5e-4, native, None, atol=1e-3, rtol=1e-3, compare_nan=True, dtype=torch.float32,
                         tolerance_hint="")
    assert ok.outcome.value == "PASS" and 0 < ok.err_to_tol <= 1
