"""The vLLM release a results file was made on, wherever two runs meet or a run is read: the scorecard and HTML name
it, `compare` and the baseline gate say when two runs are of different releases (a baseline made on vLLM 0.30
judged on 0.32 must not read as a regression of the vendor's code), `merge` refuses shards of two releases by name."""

from __future__ import annotations

import copy
import json

import pytest

from conformance.gate.compare import compare, render_markdown, render_text
from conformance.gate.merge import MergeError, merge_documents
from conformance.gate.waivers import load_baseline, regression
from conformance.report.scorecard import render_markdown as scorecard_markdown
from conformance.report.view import platform_view
from conformance.results.result import CheckResult, Outcome
from conformance.run.scope import gate_description


def _result(outcome):
    return {"nodeid": "suites/test_numerics.py::test_ir_case[rms_norm-p-float32-c1]", "check": "numerics",
            "op": "rms_norm", "provider": "p", "dtype": "float32", "case": "c1", "outcome": outcome,
            "message": None if outcome == "PASS" else "broken", "max_abs_err": 0.0, "max_rel_err": 0.0,
            "repro": None, "duration_s": 0.01}


def _doc(vllm, outcome="PASS", shard=None):
    env = {"python": "3.11", "torch": "2.13.0", "reference_impl": "0.1.0", "seed": 1}
    if vllm:
        env["vllm"] = vllm
    run = {"level": "quick", "seed": 1, "selection": {"partial": shard is not None, "keyword": None,
                                                       "markexpr": None, "paths": [], "shard": shard},
           "expected_results": 1, "written_results": 1, "complete": True}
    return {"schema_version": 1, "platform": {"name": "vllm", "class": "vllm.platforms.cpu.CpuPlatform",
                                              "device_type": "cpu"},
            "environment": env, "run": run, "results": [_result(outcome)], "summary": {},
            "verdict": "CONFORMANT" if outcome == "PASS" else "NOT_CONFORMANT"}


def test_compare_across_releases_calls_its_regressions_what_they_may_be():
    c = compare(_doc("0.30.0"), _doc("0.32.0", "FAIL"))
    assert c.release_change == "vLLM 0.30.0 before, vLLM 0.32.0 now"
    assert len(c.regressions) == 1
    text = render_text(c)
    assert ("regressions across a change of vLLM release (vLLM 0.30.0 before, vLLM 0.32.0 now): vLLM's change or the "
            "plugin's; a baseline made on the later release tells them apart:") in text
    assert "the files differ in vLLM release: 0.30.0 before, 0.32.0 now" in text
    assert "#### Regressions across a change of vLLM release (vLLM 0.30.0" in render_markdown(c)


def test_compare_on_one_release_keeps_plain_regressions():
    c = compare(_doc("0.32.0"), _doc("0.32.0", "FAIL"))
    assert c.release_change is None
    assert "\nregressions:\n" in render_text(c)
    assert "#### Regressions\n" in render_markdown(c)


def test_merge_refuses_shards_of_two_releases_naming_them():
    a, b = _doc("0.28.0", shard="1/2"), _doc("0.32.0", shard="2/2")
    b["results"][0]["op"] = "silu"
    with pytest.raises(MergeError) as err:
        merge_documents([("a.json", a), ("b.json", b)])
    assert ("the shards are of different runs: the vLLM release differs ('0.28.0' in a.json; '0.32.0' in b.json)"
            in err.value.problems)


@pytest.mark.parametrize("baseline_release, now, expected", [
    ("0.30.0", "0.32.0", "regression against the baseline: PASS before, FAIL now, across a change of vLLM release "
                         "(vLLM 0.30.0 before, vLLM 0.32.0 now): vLLM's change or the plugin's; a baseline made on "
                         "this release tells them apart"),
    ("0.32.0", "0.32.0", "regression against the baseline: PASS before, FAIL now"),
    (None, None, "regression against the baseline: PASS before, FAIL now"),
])
def test_a_baseline_gate_names_a_change_of_release(tmp_path, baseline_release, now, expected):
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(_doc(baseline_release)))
    baseline = load_baseline(str(path), "vllm")
    assert baseline.vllm == baseline_release
    fail = CheckResult("n", "numerics", "rms_norm", "p", "float32", "c1", Outcome.FAIL, "broken")
    assert regression(fail, baseline, now) == expected
    state = type("State", (), {})()
    state.waivers_path, state.waivers, state.baseline_path, state.baseline = None, [], str(path), baseline
    state.vllm_release = now
    line = gate_description(state)
    assert line.startswith(f"conformance: waivers none; baseline {path} (1 results, 1 PASS guarded)")
    assert ("made on another vLLM release" in line) == (baseline_release != now)


def test_scorecard_and_html_name_the_release():
    doc = _doc("0.28.0")
    doc["summary"] = {"counts": {"PASS": 1}}
    assert "vLLM 0.28.0" in scorecard_markdown(copy.deepcopy(doc))
    assert ("vLLM release", "0.28.0") in platform_view("vllm", doc).environment
    assert not any(k == "vllm" for k, _ in platform_view("vllm", doc).environment)   # one row, not two
