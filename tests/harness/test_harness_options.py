"""Harness options and plumbing: load errors, waivers, baseline, xdist, repro, report, schema, inertness."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conformance.exit_codes import ExitCode
from conformance.gate.waivers import Waiver, WaiverFileError, apply_waivers, load_waivers, regression, stale_waivers
from conformance.results import schema
from conformance.results.result import CheckResult, Outcome, ResultsFile, RunInfo, verdict
from harness_runner import harness_env, run_harness


@pytest.mark.parametrize("platform, fragments", [
    ("no_such_platform", ["unknown platform 'no_such_platform'", "reference_impl.platform_plugins"]),
    ("broken_import", ["plugin 'broken_import'", "conformance_broken.import_error:register",
                       "ImportError", "libvendor.so"]),
    ("broken_absent", ["platform plugin 'broken_absent'", "conformance_broken:register_absent",
                       "returned None"]),
])
def test_platform_that_cannot_load_stops_the_run_with_one_clear_line(tmp_path, platform, fragments):
    run = run_harness(tmp_path, platform, dist="broken")
    assert run.returncode == ExitCode.USAGE_ERROR
    lines = [ln for ln in run.output.splitlines() if "cannot activate --platform" in ln]
    assert len(lines) == 1, run.output[-2000:]
    for fragment in fragments:
        assert fragment in lines[0]
    assert run.doc is None   # stopped before any check ran


def test_waivers_turn_failures_into_xfail_and_stale_ones_into_xpass(tmp_path):
    """Waivers name checks as repro lines print them (or by family); they apply to failures. A PASS becomes XPASS
    only under a waiver that names that one case exactly; a glob that also covers passing cases leaves them PASS
    and, when it covers no failure at all, is reported stale without failing the run."""
    waivers = tmp_path / "waivers.toml"
    waivers.write_text('[[waiver]]\ncheck = "numerics.ir_case"\nop = "rms_norm"\ndtype = "float32"\ncase = "*769*"\n'
                       'reason = "odd tail bug, vendor ticket 1"\n\n'
                       '[[waiver]]\ncheck = "numerics"\nop = "rms_*"\ncase = "tokens=*"\n'
                       'reason = "glob over failing and passing cases"\n\n'
                       '[[waiver]]\ncheck = "numerics.ir_case"\nop = "rms_norm"\nprovider = "broken"\n'
                       'dtype = "float32"\ncase = "tokens=1,hidden=128"\nreason = "stale"\n\n'
                       '[[waiver]]\ncheck = "numerics"\ncase = "tokens=4*"\nreason = "only passing cases"\n\n'
                       '[[waiver]]\nop = "no_such_op"\nreason = "typo"\n')
    run = run_harness(tmp_path, "broken_odd_numerics", f"--conformance-waivers={waivers}", "-k",
                      "numerics and ir_case and float32", dist="broken")
    assert schema.validate(run.doc) == []
    assert run.outcomes(case="tokens=7,hidden=769") == {"XFAIL"}
    assert "waived (odd tail bug, vendor ticket 1)" in run.where(case="tokens=7,hidden=769")[0]["message"]
    assert run.outcomes(case="tokens=1,hidden=128") == {"XPASS"}       # named exactly: stale, and strict
    assert run.outcomes(case="tokens=4,hidden=256,no_weight") == {"PASS"}   # under two globs: untouched
    assert {r["outcome"] for r in run.results} == {"XFAIL", "XPASS", "PASS"}
    assert run.doc["verdict"] == "NOT_CONFORMANT" and run.returncode == 1   # strict gate on the one XPASS
    assert f"conformance: waivers {waivers} (5 waivers); baseline none" in run.output
    stale = [f"waiver [check=numerics, case=tokens=4*] (only passing cases) in {waivers} covers 2 results of this "
             "run, none of them failing: it is stale",
             f"waiver [op=no_such_op] (typo) in {waivers} matched no result of this run"]
    assert run.doc["run"]["unmatched_waivers"] == stale
    for line in stale:
        assert f"WARNING: {line}" in run.output


def test_baseline_pass_that_regresses_fails_the_run(tmp_path):
    baseline = {"results": [{"check": "numerics", "op": "rms_norm", "provider": "broken", "dtype": "float32",
                             "case": "tokens=7,hidden=769", "outcome": "PASS"}]}
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(baseline))
    run = run_harness(tmp_path, "broken_odd_numerics", f"--conformance-baseline={path}", "-k",
                      "numerics and ir_case and float32 and 769", dist="broken")
    assert run.returncode == 1
    assert "regressions against the baseline: 1" in run.output
    assert "PASS before, FAIL now" in run.output
    assert f"conformance: waivers none; baseline {path} (1 results, 1 PASS guarded)" in run.output


def test_a_baseline_of_another_platform_is_refused_not_silently_gating_nothing(tmp_path):
    """Its providers are another platform's, so none of its results would match: exit 4, one line, nothing run."""
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"platform": {"name": "other", "class": "o.P", "device_type": "cpu"},
                                "results": [{"check": "numerics", "op": "rms_norm", "provider": "fast",
                                             "dtype": "float32", "case": "tokens=7,hidden=769", "outcome": "PASS"}]}))
    run = run_harness(tmp_path, "broken_odd_numerics", f"--conformance-baseline={path}", "-k", "769", dist="broken")
    assert run.returncode == ExitCode.USAGE_ERROR
    (line,) = [ln for ln in run.output.splitlines() if ln.strip()]
    assert line == (f"ERROR: baseline {path} is a run of platform 'other', this run of platform 'broken_odd_numerics': "
                    "runs of different platforms are not compared (their providers differ, so their results cannot be "
                    "matched); compare or gate runs of one platform")
    assert run.doc is None


def test_a_baseline_that_matches_no_result_says_it_guarded_nothing(tmp_path):
    from conformance.gate.waivers import load_baseline
    from conformance.run.scope import unused_baseline_notes

    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"results": [{"check": "numerics", "op": "rms_norm", "provider": "renamed",
                                             "dtype": "float32", "case": "c", "outcome": "PASS"}]}))
    state = type("State", (), {})()
    state.baseline, state.baseline_path = load_baseline(str(path), "p"), str(path)
    state.results = [CheckResult("n", "numerics", "rms_norm", "p", "float32", "c", Outcome.PASS)]
    assert unused_baseline_notes(state) == [f"baseline {path} matched none of the 1 results of this run: it guarded "
                                            "nothing"]
    state.results.append(CheckResult("n", "numerics", "rms_norm", "renamed", "float32", "c", Outcome.PASS))
    assert unused_baseline_notes(state) == []


_WORKER_PROBE = """
import json, os, sys
def pytest_sessionfinish(session):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        with open(os.path.join(os.path.dirname(__file__), f"probe-{worker}.json"), "w") as fh:
            json.dump({"torch": "torch" in sys.modules, "platform": "conformance_demo" in sys.modules}, fh)
"""


def test_xdist_results_cover_all_workers(tmp_path):
    """Under -n 2 the same results as one process; the xdist workers collect from the controller's plan and never
    import torch or the platform (only their kernel workers do)."""
    select = ["-k", "rms_norm and float32"]
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "worker_probe.py").write_text(_WORKER_PROBE)   # the cwd is on a `python -m pytest` sys.path
    single = run_harness(tmp_path / "one", "demo", *select, dist="demo")
    spread = run_harness(tmp_path / "two", "demo", "-n", "2", "-p", "worker_probe", *select, dist="demo")
    assert spread.returncode == 0, spread.output[-2000:]
    key = lambda r: (r["nodeid"], r["outcome"], r["message"])  # noqa: E731
    assert sorted(map(key, spread.results)) == sorted(map(key, single.results))
    assert len(spread.results) > 20
    assert "conformance scorecard" in spread.output
    probes = [json.loads((tmp_path / "two" / f"probe-gw{i}.json").read_text()) for i in range(2)]
    assert probes == [{"torch": False, "platform": False}] * 2


def test_repro_command_reruns_the_failing_case(tmp_path):
    run = run_harness(tmp_path, "broken_odd_numerics", "-k", "numerics and ir_case and float32 and 769",
                      dist="broken")
    failing = run.where(outcome="FAIL")
    assert failing
    env = harness_env("broken")
    cmd = failing[0]["repro"].replace("python", sys.executable, 1)
    proc = subprocess.run(cmd, shell=True, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 1
    assert proc.stdout.startswith("FAIL  numerics.ir_case rms_norm-broken-float32-tokens=7,hidden=769")
    assert "worst at index" in proc.stdout and "points to a bug" in proc.stdout   # a dropped element: no override


def test_report_renders_markdown(tmp_path):
    doc = {"schema_version": 1, "platform": {"name": "p", "class": "m.P", "device_type": "cpu"},
           "environment": {"python": "3.11", "torch": "2.13.0", "reference_impl": "0.1.0", "seed": 1},
           "run": {"level": "quick", "seed": 1, "selection": {"partial": False, "keyword": None, "markexpr": None,
                                                              "paths": [], "shard": None},
                   "expected_results": 1, "written_results": 1, "complete": True},
           "results": [CheckResult("suites/test_numerics.py::test_ir_case[x]", "numerics", "rms_norm", "p",
                                   "float32", "c", Outcome.FAIL, "bad", repro="python -m conformance repro").to_json()],
           "summary": {"FAIL": 1}, "verdict": "NOT_CONFORMANT"}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    assert schema.validate(doc) == []
    out = subprocess.run([sys.executable, "-m", "conformance", "report", str(path)], capture_output=True,
                         text=True, check=True).stdout
    assert "# Compatibility report: `p`" in out and "**NOT_CONFORMANT**" in out and "| rms_norm" in out


def test_schema_validation_names_problems():
    doc = {"schema_version": 2, "platform": {}, "environment": {}, "results": [{"check": "speed"}],
           "summary": {"PASS": 1}, "verdict": "MAYBE"}
    problems = "\n".join(schema.validate(doc))
    for fragment in ("schema_version", "platform", "environment", "results[0]", "speed", "verdict"):
        assert fragment in problems


def test_results_file_is_valid_while_running_and_gates_until_finished(tmp_path):
    rf = ResultsFile(str(tmp_path / "r.json"), {"name": "p", "class": "m.P", "device_type": "cpu"},
                     {"python": "3", "torch": "2", "reference_impl": "0", "seed": 1}, min_interval_s=0,
                     run=RunInfo("quick", 1, expected_results=1))
    rf.add(CheckResult("n", "numerics", "op", "p", "float32", "c", Outcome.PASS))
    partial = json.loads((tmp_path / "r.json").read_text())
    assert schema.validate(partial) == [] and partial["verdict"] == "NOT_CONFORMANT"
    assert partial["run"]["complete"] is False and partial["run"]["written_results"] == 1
    rf.write(final=True)
    final = json.loads((tmp_path / "r.json").read_text())
    assert final["verdict"] == "CONFORMANT" and final["run"]["complete"] is True
    assert schema.validate(final) == []


def test_verdict_rules():
    mk = lambda o: CheckResult("n", "dispatch", None, None, None, None, o, "m")  # noqa: E731
    assert verdict([mk(o) for o in ("PASS", "NOT_IMPLEMENTED", "NOT_SUPPORTED", "SKIP", "XFAIL",
                                    "QUALITY_WARNING")]) == "CONFORMANT"
    for bad in ("FAIL", "ERROR", "TIMEOUT", "CRASH", "XPASS"):
        assert verdict([mk("PASS"), mk(bad)]) == "NOT_CONFORMANT"
    assert verdict([mk("XPASS")], strict_xpass=False) == "CONFORMANT"


def test_waiver_and_baseline_logic(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"waivers": [{"op": "rms_*", "reason": "known"}]}))
    (waiver,) = load_waivers(str(path))
    fail = CheckResult("n", "numerics", "rms_norm", "p", "float32", "c", Outcome.FAIL, "bad")
    assert apply_waivers(fail, [waiver]).outcome is Outcome.XFAIL
    ok = CheckResult("n", "numerics", "silu", "p", "float32", "c", Outcome.PASS)
    assert apply_waivers(ok, [waiver]).outcome is Outcome.PASS
    path.write_text(json.dumps([{"op": "x"}]))
    with pytest.raises(WaiverFileError, match="needs a reason"):
        load_waivers(str(path))
    base = {("numerics", "rms_norm", "p", "float32", "c"): "PASS"}
    assert "PASS before, FAIL now" in regression(fail, base)
    assert regression(ok, base) is None


def _result(outcome, check="numerics.ir_case", op="rms_norm", case="tokens=7,hidden=769"):
    family, _, name = check.partition(".")
    return CheckResult(f"suites/test_{family}.py::test_{name}[{op}-p-float32-{case}]", family, op, "p", "float32",
                       case, Outcome(outcome), None if outcome == "PASS" else "bad",
                       repro=f"python -m conformance repro --platform x --check {check} --op {op} --provider p "
                             f"--dtype float32 --case {case} --seed 1 --level quick")


def test_a_waiver_names_checks_as_repro_lines_do_and_passes_only_when_exact():
    """`numerics.ir_case` copied from a repro line matches (it used to match nothing); so does the family. A PASS
    turns XPASS only under a waiver naming every field of that case literally."""
    family = Waiver("known", check="numerics", op="rms_norm")
    copied = Waiver("known", check="numerics.ir_case", op="rms_norm")
    other = Waiver("known", check="numerics.ir_property", op="rms_norm")
    fail = _result("FAIL")
    assert apply_waivers(fail, [copied]).outcome is Outcome.XFAIL
    assert apply_waivers(fail, [family]).outcome is Outcome.XFAIL
    assert apply_waivers(fail, [other]).outcome is Outcome.FAIL
    assert apply_waivers(fail, [Waiver("x", check="numerics.ir_*")]).outcome is Outcome.XFAIL
    passed = _result("PASS")
    for broad in (family, copied, Waiver("x", check="numerics.ir_case", op="rms_norm", provider="p", dtype="float32",
                                         case="tokens=7*")):
        assert apply_waivers(passed, [broad]).outcome is Outcome.PASS, broad
    exact = Waiver("fixed?", check="numerics.ir_case", op="rms_norm", provider="p", dtype="float32",
                   case="tokens=7,hidden=769")
    assert apply_waivers(passed, [family, exact]).outcome is Outcome.XPASS
    assert apply_waivers(passed, [Waiver("f", check="numerics", op="rms_norm", provider="p", dtype="float32",
                                         case="tokens=7,hidden=769")]).outcome is Outcome.PASS   # family: 3 checks
    assert stale_waivers([family, exact], [apply_waivers(passed, [family, exact])]) == [
        (family, "covers 1 results of this run, none of them failing: it is stale")]
    assert stale_waivers([family], [apply_waivers(fail, [family])]) == []


@pytest.mark.parametrize("entry, fragment", [
    ({"check": "ir_case", "reason": "r"}, "waiver 0: check 'ir_case' names no check: give a family (numerics, "),
    ({"check": "numerics.ir_cases", "reason": "r"}, "numerics.ir_case, numerics.ir_property"),
    ({"op": 5, "reason": "r"}, "waiver 0: op must be text"),
])
def test_a_waiver_that_can_match_nothing_is_refused(tmp_path, entry, fragment):
    path = tmp_path / "w.json"
    path.write_text(json.dumps([entry]))
    with pytest.raises(WaiverFileError) as info:
        load_waivers(str(path))
    assert str(info.value).startswith(f"{path}: ") and fragment in str(info.value)
    path.write_text(json.dumps([{"check": "numerics.*", "reason": "r"}, {"check": "aliasing", "reason": "r"}]))
    assert [w.check for w in load_waivers(str(path))] == ["numerics.*", "aliasing"]


def test_plugin_is_inert_without_platform(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert True\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_one.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "1 passed" in proc.stdout
    assert "conformance:" not in proc.stdout and "scorecard" not in proc.stdout


@pytest.mark.parametrize("name, content, fragment", [
    ("w.json", {"a": 1}, "expected a list of waivers or {\"waivers\": [...]}, found top-level keys ['a']"),
    ("w.json", {"waivers": {"op": "x"}}, "found a dict"),
    ("w.json", "not json", "cannot read waivers file"),
    ("w.toml", "[waivers]\nop = 'x'\n", "expected [[waiver]] tables, found top-level keys ['waivers']"),
])
def test_waivers_file_of_the_wrong_shape_is_an_error_naming_it(tmp_path, name, content, fragment):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(WaiverFileError) as info:
        load_waivers(str(path))
    assert str(path) in str(info.value) and fragment in str(info.value)
    empty = tmp_path / "empty.toml"
    empty.write_text("# no waivers yet\n")
    assert load_waivers(str(empty)) == []


@pytest.mark.parametrize("content, fragment", [
    ({"a": 1}, "is not a results file: expected an object with a 'results' list, found top-level keys ['a']"),
    ([1], "a results file is a JSON object, this is a list"),
    ({"results": [{"check": "numerics", "outcome": "GOOD"}]}, "results[0] is not a result"),
])
def test_baseline_of_the_wrong_shape_is_an_error_naming_it(tmp_path, content, fragment):
    from conformance.gate.waivers import load_baseline

    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(content))
    with pytest.raises(WaiverFileError) as info:
        load_baseline(str(path))
    assert str(path) in str(info.value) and fragment in str(info.value)


def test_allowlist_names_nothing_installed_or_is_bypassed(monkeypatch, caplog):
    from reference_impl import plugins

    monkeypatch.setenv(plugins.PLUGINS_ENV, "nosuch, other")
    assert plugins.unknown_allowlist_names() == ["nosuch", "other"]
    with caplog.at_level("WARNING", logger=plugins.__name__):
        assert plugins.load_plugins_by_group(plugins.PLATFORM_PLUGINS_GROUP) == {}
    assert "REFERENCE_IMPL_PLUGINS=nosuch, other names 'nosuch', 'other', which no installed plugin declares" in \
        caplog.text
    assert plugins.allowlist_bypass_message("cpu", {"cpu"}) is None        # built-ins are not plugins
    assert "bypasses the allowlist" in plugins.allowlist_bypass_message("vendor", {"cpu"})
    monkeypatch.setenv(plugins.PLUGINS_ENV, "vendor")
    assert plugins.allowlist_bypass_message("vendor", {"cpu"}) is None
    monkeypatch.delenv(plugins.PLUGINS_ENV)
    assert plugins.unknown_allowlist_message() is None and plugins.allowlist_bypass_message("vendor", set()) is None
