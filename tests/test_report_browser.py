"""The HTML report in a real headless browser: renders without console errors, plugin strings stay text, screenshot."""

from __future__ import annotations

import copy
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from _browser import console_messages, ensure_chromium, load

from conformance.report.html import render_html

ROOT = Path(__file__).resolve().parent.parent
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
