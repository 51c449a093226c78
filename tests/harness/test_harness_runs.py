"""Whole harness runs in a subprocess: a hang costs two limits, a killed run is incomplete, a -k run is
partial, misconfiguration stops the run with one line, and the scorecard hints at the cause."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

from conformance.exit_codes import ExitCode
from conformance.results import schema
from harness_runner import harness_command, harness_env, run_harness
from process_tree import dead_pid

LIMIT = 2.0


def test_hanging_provider_costs_two_limits_and_every_check_is_still_reported(tmp_path):
    # what a run killed earlier left in the temporary directory (its controller gone) goes at this run's start
    killed = tmp_path / f"conformance-run-{dead_pid()}-{os.stat('/proc/self/ns/pid').st_ino}-abcd1234"
    (killed / "conformance-engine-process-1-1-efgh5678").mkdir(parents=True)
    # every family but the collective one: its checks start a world of rank processes, which alone takes longer than
    # this 2-s limit (on 2 cores, loaded or not), so they were 20 TIMEOUTs that are not the hang's, each restarting a
    # kernel worker: 27 s of a run that takes 8 s without them (45 s against 8 s beside two busy processes)
    run = run_harness(tmp_path, "broken_hangs", f"--conformance-timeout={LIMIT:g}", "-n", "2", "-k", "not collective",
                      dist="broken", env={"TMPDIR": str(tmp_path)})
    assert run.doc is not None, run.output[-3000:]
    assert schema.validate(run.doc) == []
    assert run.returncode == ExitCode.FAILED and run.doc["verdict"] == "NOT_CONFORMANT"
    meta = run.doc["run"]
    assert meta["complete"] and meta["written_results"] == meta["expected_results"] == len(run.results)
    hung = run.where(provider="broken", op="rms_norm")
    # under -n the heaviest checks start first (conformance.run.shard.longest_first): the checks that never call this
    # provider's kernel (supports_args: it registers no predicate; priority and defaults: they only resolve
    # dispatch) may finish before the hang poisons the provider; every other check of it is a real TIMEOUT or, once
    # the provider is poisoned, a SKIP that says it was not run (never a TIMEOUT it did not have)
    never_call_kernel = {"test_supports_args[rms_norm-broken]": r"no supports_args: accepts every input",
                         "test_priority[rms_norm-broken]": r"\d+ inputs resolved as specified",
                         "test_defaults[rms_norm-broken]": r"selectable \(e\.g\. case .+\)"}
    ran = [r for r in hung if r["outcome"] not in ("TIMEOUT", "SKIP")]
    assert all(r["outcome"] == "PASS" and re.fullmatch(never_call_kernel.get(r["nodeid"].split("::")[-1], "(?!)"),
                                                        r["message"]) for r in ran), ran
    hung = [r for r in hung if r not in ran]
    assert len(hung) > 40
    waited = [r for r in hung if r["outcome"] == "TIMEOUT"]
    assert not [r for r in waited if r["message"].startswith("not run:")]
    # two xdist workers may each be inside a hang before either has recorded one: at most 2 + 1 real waits
    assert 2 <= len(waited) <= 3, [r["nodeid"] for r in waited]
    assert all(r["duration_s"] >= LIMIT for r in waited)
    # the cost bound without a clock: at most three real waits (above) and every other check of the provider was
    # ended at once (below), whatever the speed of the machine (a bound on summed durations failed when loaded)
    skipped = [r for r in hung if r["outcome"] == "SKIP"]
    assert all(re.match(r"not run: provider broken of op rms_norm hung in \w+\.\w+ \[rms_norm-broken-", r["message"])
               and r["message"].endswith("(its own outcome was not observed)") for r in skipped), skipped[0]["message"]
    assert {r["duration_s"] for r in skipped} == {0.0}
    model = run.where(check="model")
    assert model and all(r["outcome"] == "SKIP" and "the model runs the platform's default providers, and "
                         "provider broken of op rms_norm hung" in r["message"] for r in model)
    assert run.outcomes(check="dispatch", provider=None) == {"NOT_IMPLEMENTED"}
    # killed and restarted kernel workers leave no logs behind, nor does the run its shared directory
    assert not list(tmp_path.glob("conformance-worker-*")) and not list(tmp_path.glob("conformance-run-*"))
    assert not killed.exists()


def test_run_killed_with_sigkill_leaves_an_incomplete_file(tmp_path):
    out = tmp_path / "results.json"
    # TMPDIR: the run directory a killed run cannot remove lands in tmp_path, not in /tmp
    proc = subprocess.Popen(harness_command("demo", out, "quick"), cwd=tmp_path,
                            env=harness_env("demo", TMPDIR=str(tmp_path)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            doc = json.loads(out.read_text()) if out.exists() else None
            if doc and doc["run"]["written_results"] >= 5:
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.2)
        else:
            raise AssertionError("no results written within 240 s")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    doc = json.loads(out.read_text())
    assert schema.validate(doc) == []
    assert doc["run"]["complete"] is False and doc["verdict"] == "NOT_CONFORMANT"
    assert doc["run"]["written_results"] < doc["run"]["expected_results"]
    cli = [sys.executable, "-m", "conformance"]
    validate = subprocess.run([*cli, "validate", str(out)], capture_output=True, text=True, timeout=120)
    assert validate.returncode == ExitCode.FAILED
    assert "valid schema, but INCOMPLETE" in validate.stdout and "the run did not finish" in validate.stdout
    report = subprocess.run([*cli, "report", str(out)], capture_output=True, text=True, timeout=120)
    assert report.returncode == ExitCode.OK, report.stderr
    assert "> **INCOMPLETE:" in report.stdout and "**NOT_CONFORMANT (INCOMPLETE run" in report.stdout
    assert ("coverage so far: 2 IR ops implemented (fused_add_rms_norm, rms_norm)" in report.stdout
            or "coverage so far: 1 IR ops implemented" in report.stdout), report.stdout[:2000]
    assert f"INCOMPLETE run: {doc['run']['written_results']} of {doc['run']['expected_results']} planned results " \
           "written" in report.stdout
    assert [p.name for p in tmp_path.glob("conformance-run-*")], "the run directory was not under TMPDIR"


def test_keyword_run_is_partial_counts_as_pytest_does_and_says_how_plugins_were_chosen(tmp_path):
    run = run_harness(tmp_path, "demo", "-k", "dispatch or unsupported", dist="demo",
                      env={"REFERENCE_IMPL_PLUGINS": "nosuch"})
    assert run.returncode == ExitCode.OK, run.output[-3000:]
    meta = run.doc["run"]
    assert meta["selection"] == {"partial": True, "keyword": "dispatch or unsupported", "markexpr": None,
                                 "paths": [], "shard": None}
    assert meta["complete"] and meta["level"] == "quick" and meta["written_results"] == meta["expected_results"]
    assert run.doc["verdict"] == "CONFORMANT"   # the JSON keeps the two words of docs/results-file.md ...
    assert "!!! PARTIAL SELECTION (-k 'dispatch or unsupported')" in run.output
    assert "verdict: CONFORMANT FOR THE SELECTED CHECKS ONLY" in run.output
    assert not re.search(r"^verdict: CONFORMANT$", run.output, re.M)   # ... people never see a plain one
    outcomes = [r["outcome"] for r in run.results]
    skips = sum(outcomes.count(o) for o in ("NOT_IMPLEMENTED", "NOT_SUPPORTED", "SKIP"))
    assert re.search(rf"\b{outcomes.count('PASS')} passed, {skips} skipped, \d+ deselected", run.output), \
        run.output[-600:]
    # pytest's item count is the check count: a suite body with nothing to check on this platform (demo registers
    # no supported=False provider, so numerics.unsupported has no unit) collects no item at all
    collected = re.search(r"collected (\d+) items / (\d+) deselected / (\d+) selected", run.output)
    assert collected and int(collected.group(3)) == meta["written_results"], run.output[:3000]
    assert "test_unsupported" not in run.output
    assert "1NI" not in run.output and "CustomOp layers not replaced" in run.output
    assert ("REFERENCE_IMPL_PLUGINS=nosuch names 'nosuch', which no installed plugin declares" in run.output)
    assert "--platform=demo is not in REFERENCE_IMPL_PLUGINS=nosuch: an explicit platform bypasses" in run.output
    report = subprocess.run([sys.executable, "-m", "conformance", "report", str(tmp_path / "demo.json")],
                            capture_output=True, text=True, timeout=120)
    assert "PARTIAL SELECTION" in report.stdout and "CONFORMANT FOR THE SELECTED CHECKS ONLY" in report.stdout, \
        report.stderr[-2000:]


def test_wrong_shape_baseline_or_waivers_stop_the_run_naming_the_file(tmp_path):
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"a": 1}))
    for option, fragment in (("--conformance-baseline", "is not a results file: expected an object with a "
                                                        "'results' list, found top-level keys ['a']"),
                             ("--conformance-waivers", "expected a list of waivers or {\"waivers\": [...]}")):
        run = run_harness(tmp_path, "demo", f"{option}={wrong}", dist="demo")
        assert run.returncode == ExitCode.USAGE_ERROR, run.output[-2000:]
        lines = [ln for ln in run.output.splitlines() if str(wrong) in ln]
        assert len(lines) == 1 and fragment in lines[0], run.output[-2000:]
        assert "Traceback" not in run.output and run.doc is None


def test_missing_epsilon_gets_a_cause_hint_naming_tiny_magnitudes(tmp_path):
    run = run_harness(tmp_path, "broken_missing_epsilon", "-k", "numerics and ir_case", dist="broken")
    assert run.returncode == ExitCode.FAILED
    failing = run.where(outcome="FAIL")
    assert failing and {r["case"] for r in failing} == {"tokens=3,hidden=512,tiny"}
    assert run.outcomes(check="numerics", case="tokens=7,hidden=769") == {"PASS"}
    hint = [ln for ln in run.output.splitlines() if "cause hint:" in ln]
    assert len(hint) == 1 and "only tiny magnitudes fail" in hint[0] and "epsilon" in hint[0], run.output[-3000:]
