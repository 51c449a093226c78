"""The results file's `run` block and environment, its validation, and one-line errors for unreadable files."""

from __future__ import annotations

import json

import pytest

from conformance.collect.environment import collect
from conformance.results import schema
from conformance.results.result import (CheckResult, Outcome, ResultsFile, ResultsFileError, RunInfo, Selection,
                                       load_results)
from conformance.results.schema import run_status

PLATFORM = {"name": "p", "class": "m.P", "device_type": "cpu"}
ENV = {"python": "3.11", "torch": "2.13.0", "reference_impl": "0.1.0", "seed": 7}


def _result(outcome: Outcome = Outcome.PASS, case: str = "c") -> CheckResult:
    return CheckResult("suites/test_numerics.py::test_ir_case[x]", "numerics", "rms_norm", "p", "float32", case,
                       outcome, None if outcome is Outcome.PASS else "bad")


def _file(tmp_path, expected: int, selection: Selection | None = None) -> ResultsFile:
    run = RunInfo("quick", 7, selection or Selection(), expected_results=expected)
    return ResultsFile(str(tmp_path / "r.json"), PLATFORM, dict(ENV), min_interval_s=0, run=run)


def _read(tmp_path) -> dict:
    return json.loads((tmp_path / "r.json").read_text())


def test_run_block_records_level_seed_selection_and_counts(tmp_path):
    sel = Selection(partial=True, keyword="rms_norm", markexpr=None, paths=["suites/test_numerics.py"])
    rf = _file(tmp_path, expected=2, selection=sel)
    rf.add(_result())
    doc = _read(tmp_path)
    assert list(doc) == ["schema_version", "platform", "environment", "run", "results", "summary", "verdict"]
    assert doc["run"] == {"level": "quick", "seed": 7,
                          "selection": {"partial": True, "keyword": "rms_norm", "markexpr": None,
                                        "paths": ["suites/test_numerics.py"], "shard": None},
                          "expected_results": 2, "written_results": 1, "complete": False,
                          "unmatched_waivers": [], "gate_upstream": False}
    assert schema.validate(doc) == []
    rf.add(_result())
    rf.write(final=True)
    doc = _read(tmp_path)
    assert doc["run"]["complete"] is True and doc["verdict"] == "CONFORMANT"
    assert run_status(doc)[:2] == (True, True)
    assert "PARTIAL SELECTION (-k 'rms_norm', paths suites/test_numerics.py)" in run_status(doc)[2]


def test_final_write_of_a_run_that_stopped_early_is_incomplete_and_not_conformant(tmp_path):
    rf = _file(tmp_path, expected=3)
    rf.add(_result())
    rf.write(final=True)                       # fewer results than collected (-x, a lost xdist worker)
    doc = _read(tmp_path)
    assert doc["run"]["complete"] is False and doc["verdict"] == "NOT_CONFORMANT"
    rf.add(_result())
    rf.add(_result())
    rf.write(final=True, finished=False)       # all written, but the session was interrupted
    doc = _read(tmp_path)
    assert doc["run"]["complete"] is False and doc["verdict"] == "NOT_CONFORMANT"
    complete, partial, line = run_status(doc)
    assert not complete and not partial and line.startswith("INCOMPLETE: 3 of 3 expected results written")
    assert schema.validate(doc) == []


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d["run"].update(written_results=5), "run.written_results is 5 but the file holds 1 results"),
    (lambda d: d["run"].update(expected_results=0), "exceeds run.expected_results 0"),
    (lambda d: d["run"].update(complete=True), "run.complete is true but 1 of 2 expected results were written"),
    (lambda d: d.update(verdict="CONFORMANT"), "verdict is CONFORMANT but run.complete is false"),
    (lambda d: d["run"].update(level="fast"), "run.level 'fast' is not one of"),
    (lambda d: d["run"].update(seed="7"), "run.seed has type str"),
    (lambda d: d["run"].update(complete=1), "run.complete has type int"),
    (lambda d: d["run"]["selection"].pop("shard"), "run.selection lacks ['shard']"),
    (lambda d: d["run"]["selection"].update(paths=[1]), "run.selection.paths must be a list of strings"),
    (lambda d: d.pop("run"), "missing ['run']"),
    (lambda d: d["environment"].update(triton=3), "environment.triton has type int"),
    (lambda d: d["environment"].update(plugin={"distribution": "x"}), "environment.plugin must be"),
    (lambda d: d["environment"].update(gpu="h100"), "environment has unknown keys ['gpu']"),
])
def test_validate_checks_the_run_block_and_environment(tmp_path, edit, fragment):
    rf = _file(tmp_path, expected=2)
    rf.add(_result())
    doc = _read(tmp_path)
    assert schema.validate(doc) == []
    edit(doc)
    problems = schema.validate(doc)
    assert any(fragment in p for p in problems), problems


def test_environment_optional_keys_are_accepted_and_collected():
    env = collect(3, "cpu", type("P", (), {"device_type": "cpu"})())
    assert {"python", "torch", "reference_impl", "seed", "triton", "device_name", "driver", "plugin"} == set(env)
    assert env["seed"] == 3 and env["plugin"] is None   # a built-in platform comes from no distribution
    assert env["driver"] is None                        # no driver for a cpu device
    doc = {"schema_version": 1, "platform": PLATFORM, "environment": {**env, "plugin": {"distribution": "d",
                                                                                        "version": "1"}},
           "run": RunInfo("quick", 3).to_json(0, True), "results": [], "summary": {}, "verdict": "CONFORMANT"}
    assert schema.validate(doc) == []


@pytest.mark.parametrize("content, fragment", [
    (None, "no such results file"),
    ("", "the file is empty"),
    ('{"schema_version": 1, "results": [{"check": "numer', "the file looks truncated"),
    ("[1, 2]", "a results file is a JSON object, this is a list"),
])
def test_unreadable_results_file_is_one_line_naming_the_file(tmp_path, content, fragment):
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ResultsFileError) as info:
        load_results(str(path))
    message = str(info.value)
    assert message.startswith(str(path)) and fragment in message and "\n" not in message


def test_result_attribute_is_family_and_the_file_field_stays_check():
    """`CheckResult.family` holds the check family (`Unit.check` is a check's own name, `ir_case`); the results file
    keeps its public member name `check`, in its documented place (docs/results-file.md)."""
    result = _result(Outcome.FAIL)
    assert result.family == "numerics" and not hasattr(result, "check")
    assert CheckResult(nodeid=None, family="dispatch", op=None, provider=None, dtype=None, case=None,
                       outcome="PASS").family == "dispatch"
    data = result.to_json()
    assert list(data) == ["nodeid", "check", "op", "provider", "dtype", "case", "outcome", "message", "max_abs_err",
                          "max_rel_err", "repro", "duration_s", "err_to_tol", "origin", "hint"]
    assert data["check"] == "numerics" and "family" not in data
    with pytest.raises(ValueError, match="family 'speed' .* is not one of"):
        CheckResult.from_json({**data, "check": "speed"})


def test_results_file_entry_round_trips_byte_for_byte(tmp_path):
    """`from_json` reads `check` into `family` and `to_json` writes it back: an entry re-encodes to the same bytes,
    and the line the results file holds for it is unchanged by the attribute's name."""
    line = ('{"nodeid": "suites/test_numerics.py::test_ir_case[rms_norm-p-bfloat16-tokens=7]", "check": "numerics", '
            '"op": "rms_norm", "provider": "p", "dtype": "bfloat16", "case": "tokens=7", "outcome": "FAIL", '
            '"message": "max abs err 3.1e-02 > atol 1e-03", "max_abs_err": 0.031, "max_rel_err": 0.02, '
            '"repro": "python -m conformance repro --check numerics.ir_case", "duration_s": 0.01, "err_to_tol": 31.0, '
            '"origin": {"distribution": "my-plugin", "version": "1.2.0", "code": "my_plugin.kernels.rms_norm", '
            '"upstream": false}, "hint": "only odd sizes fail"}')
    entry = json.loads(line)
    result = CheckResult.from_json(entry)
    assert result.family == "numerics" and result.outcome is Outcome.FAIL
    assert json.dumps(result.to_json()) == line
    assert CheckResult.from_json(result.to_json()) == result
    dispatch = {"nodeid": "suites/test_dispatch.py::test_coverage[silu]", "check": "dispatch", "op": "silu",
                "provider": None, "dtype": None, "case": None, "outcome": "NOT_IMPLEMENTED", "message": "native runs",
                "max_abs_err": None, "max_rel_err": None, "repro": None, "duration_s": 0.0}   # older: no err_to_tol
    assert CheckResult.from_json(dispatch).to_json() == {**dispatch, "err_to_tol": None, "origin": None, "hint": None}
    rf = _file(tmp_path, expected=1)
    rf.add(result)
    rf.write(final=True)
    assert f"\n  {line}\n" in (tmp_path / "r.json").read_text()
    assert _read(tmp_path)["results"] == [entry]
