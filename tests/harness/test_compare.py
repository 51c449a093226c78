"""`conformance compare`: regressions, improvements, added/removed cases, exit status, the PR-comment markdown."""

from __future__ import annotations

import json

import pytest

from conformance.cli import main
from conformance.gate.comparable import NotComparable
from conformance.gate.compare import compare, render_markdown


def _r(op, outcome, case="c1", check="numerics", test="test_ir_case", provider="p", dtype="float32", message=None):
    return {"nodeid": f"suites/test_{check}.py::{test}[{op}-{provider}-{dtype}-{case}]", "check": check, "op": op,
            "provider": provider, "dtype": dtype, "case": case, "outcome": outcome,
            "message": message if message is not None else (None if outcome == "PASS" else f"{outcome} here"),
            "max_abs_err": None, "max_rel_err": None, "repro": None, "duration_s": 0.1}


def _doc(results, verdict="CONFORMANT", name="plat"):
    return {"schema_version": 1, "platform": {"name": name, "class": "x.Plat", "device_type": "cpu"},
            "environment": {"python": "3.11", "torch": "2.13.0", "reference_impl": "0.1.0", "seed": 1},
            "results": results, "summary": {}, "verdict": verdict}


OLD = _doc([_r("a", "PASS"), _r("b", "PASS"), _r("c", "FAIL"), _r("d", "NOT_SUPPORTED"), _r("e", "FAIL"),
            _r("gone", "PASS"), _r("q", "QUALITY_WARNING"),
            _r("x", "PASS", check="dispatch", test="test_priority", dtype=None, case=None),
            _r("x", "PASS", check="dispatch", test="test_supports_args", dtype=None, case=None)], "NOT_CONFORMANT")
NEW = _doc([_r("a", "PASS"), _r("b", "NOT_SUPPORTED"), _r("c", "PASS"), _r("d", "FAIL"), _r("e", "ERROR"),
            _r("new_ok", "PASS"), _r("new_bad", "CRASH"), _r("q", "FAIL"),
            _r("x", "PASS", check="dispatch", test="test_priority", dtype=None, case=None),
            _r("x", "FAIL", check="dispatch", test="test_supports_args", dtype=None, case=None)], "NOT_CONFORMANT")


def _ops(changes):
    return sorted(ch.key[2] + ("/" + ch.key[1] if ch.key[0] == "dispatch" else "") for ch in changes)


def test_compare_classifies_every_kind_of_change():
    c = compare(OLD, NEW)
    # PASS -> anything else, blocking now but not before (NS -> FAIL, QW -> FAIL), and a new failing case
    assert _ops(c.regressions) == ["b", "d", "new_bad", "q", "x/test_supports_args"]
    assert _ops(c.improvements) == ["c"]
    assert _ops(c.changed) == ["e"]                  # FAIL -> ERROR: failing before and now
    assert _ops(c.added) == ["new_bad", "new_ok"]
    assert _ops(c.removed) == ["gone"]
    assert c.unchanged == 2                          # a, and dispatch priority of x (told apart from supports_args)


def test_identical_files_compare_clean():
    c = compare(OLD, OLD)
    assert not (c.regressions or c.improvements or c.changed or c.added or c.removed)
    assert c.unchanged == len(OLD["results"])


def test_compare_cli_exits_nonzero_on_regressions_and_writes_markdown(tmp_path, capsys):
    old, new, md = tmp_path / "old.json", tmp_path / "new.json", tmp_path / "pr.md"
    old.write_text(json.dumps(OLD))
    new.write_text(json.dumps(NEW))
    assert main(["compare", str(old), str(new), "--markdown", str(md)]) == 1
    out = capsys.readouterr().out
    assert "5 regressions, 1 improvements, 1 other changes, 2 added, 1 removed, 2 unchanged" in out
    assert "numerics.test_ir_case b p float32 c1: PASS -> NOT_SUPPORTED" in out
    text = md.read_text()
    assert text.startswith("### Conformance: regressions found")
    assert "| 5 | 1 | 1 | 2 | 1 | 2 |" in text
    assert "| `numerics.test_ir_case new_bad p float32 c1` | new | CRASH | `CRASH here` |" in text
    # no regressions: exit 0 (improvements alone do not fail the gate)
    assert main(["compare", str(new), str(new)]) == 0
    better = _doc([_r("a", "PASS"), _r("c", "PASS")])
    worse = tmp_path / "worse.json"
    worse.write_text(json.dumps(_doc([_r("a", "PASS"), _r("c", "FAIL")], "NOT_CONFORMANT")))
    (tmp_path / "better.json").write_text(json.dumps(better))
    assert main(["compare", str(worse), str(tmp_path / "better.json")]) == 0


def test_markdown_keeps_plugin_messages_inside_their_cell():
    old = _doc([_r("a", "PASS")])
    new = _doc([_r("a", "FAIL", message="bad | cell `code` <b>x</b>\nsecond line")], "NOT_CONFORMANT")
    text = render_markdown(compare(old, new))
    row = next(line for line in text.splitlines() if line.startswith("| `numerics"))
    assert row.count("|") == 5                        # the message's pipe cannot open a new column
    assert "`bad / cell 'code' <b>x</b> second line`" in row   # one code span: shown literally on GitHub


def test_compare_notes_files_of_different_runs_and_rejects_unreadable_ones(tmp_path, capsys):
    quick = dict(OLD, run={"level": "quick", "complete": True})
    assert compare(quick, dict(NEW, run={"level": "standard", "complete": True})).notes == [
        "the files differ in level: quick before, standard now"]
    killed = dict(NEW, run={"complete": False, "written_results": 3, "expected_results": 10})
    assert compare(OLD, killed).notes == ["the later file is incomplete (3 of 10 results): missing cases show as "
                                          "removed or added"]
    (tmp_path / "old.json").write_text(json.dumps(OLD))
    (tmp_path / "bad.json").write_text("{truncated")
    assert main(["compare", str(tmp_path / "old.json"), str(tmp_path / "bad.json")]) == 4
    assert main(["compare", str(tmp_path / "old.json"), str(tmp_path / "missing.json")]) == 4
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"conformance compare: {tmp_path / 'bad.json'}: not valid JSON")
    assert err[1] == f"conformance compare: {tmp_path / 'missing.json'}: no such results file"


def test_runs_of_different_platforms_are_refused_not_called_regressions(tmp_path, capsys):
    """Every difference between two platforms' files would read as a regression: nothing is judged, exit 4."""
    other = _doc([_r("a", "FAIL", provider="q")], "NOT_CONFORMANT", name="other")
    with pytest.raises(NotComparable, match="OLD is a run of platform 'plat', NEW of platform 'other'"):
        compare(OLD, other)
    old, new, md = tmp_path / "old.json", tmp_path / "new.json", tmp_path / "pr.md"
    old.write_text(json.dumps(OLD))
    new.write_text(json.dumps(other))
    assert main(["compare", str(old), str(new), "--markdown", str(md)]) == 4
    captured = capsys.readouterr()
    assert captured.out == "" and not md.exists()
    (line,) = captured.err.splitlines()
    assert line.startswith(f"conformance compare: {old} is a run of platform 'plat', {new} of platform 'other': "
                           "runs of different platforms are not compared")
    unnamed = {k: v for k, v in OLD.items() if k != "platform"}     # a file that does not say is compared
    assert compare(unnamed, other).regressions
