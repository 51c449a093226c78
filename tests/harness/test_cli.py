"""The `conformance` command line: complete help with the exit-code table, one-line errors, the exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.cli import main
from conformance.exit_codes import ExitCode, markdown_table
from conformance.results.result import RunInfo, load_results

ROOT = Path(__file__).resolve().parents[2]
SUBCOMMANDS = ("repro", "report", "validate", "publish")


def _help(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", ("", *SUBCOMMANDS))
def test_every_help_prints_the_exit_code_table(capsys, command):
    text = _help(capsys, *([command] if command else []))
    assert "exit codes (pytest --platform=NAME and every conformance subcommand)" in text
    for code in ExitCode:
        assert f"{int(code)} {code.name}" in text


def test_pytest_help_of_platform_gives_the_same_codes(tmp_path):
    from conformance.exit_codes import one_line

    proc = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == ExitCode.OK
    assert " ".join(one_line().split()) in " ".join(proc.stdout.split())
    assert "4 misconfiguration (nothing judged)" in one_line()


def test_subcommand_help_describes_arguments_and_defaults(capsys):
    repro = _help(capsys, "repro")
    assert "numerics.ir_case" in repro and "dispatch.supports_args" in repro and "model.decoder" in repro
    assert "(default 1234)" in repro and "(default standard)" in repro
    report = _help(capsys, "report")
    assert "results files (JSON)" in report and "markdown printed to stdout" in report and ".html" in report
    assert "the results file (JSON) to check" in _help(capsys, "validate")
    assert "(default reports)" in _help(capsys, "publish")


def test_exit_code_table_is_pytests_and_is_documented():
    for code in pytest.ExitCode:   # the same value for the same meaning
        assert ExitCode[code.name.replace("TESTS_FAILED", "FAILED")] == code.value
    assert markdown_table() in (ROOT / "docs" / "exit-codes.md").read_text()


def test_bad_arguments_exit_with_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["repro", "--level", "fast", "--platform", "cpu", "--check", "numerics.ir_case"])
    assert info.value.code == ExitCode.USAGE_ERROR


def _one_line_error(capsys, argv, *fragments) -> None:
    assert main(argv) == ExitCode.USAGE_ERROR
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize("command", ("validate", "report"))
def test_missing_truncated_or_wrong_shape_file_is_one_line(tmp_path, capsys, command):
    missing = tmp_path / "missing.json"
    _one_line_error(capsys, [command, str(missing)], str(missing), "no such results file")
    truncated = tmp_path / "truncated.json"
    truncated.write_text('{"schema_version": 1, "platform": {"name": "p", "cl')
    _one_line_error(capsys, [command, str(truncated)], str(truncated), "not valid JSON", "truncated")


@pytest.mark.parametrize("command", ("validate", "report", "merge", "compare"))
def test_a_file_that_is_not_utf8_text_is_one_line_naming_it(tmp_path, capsys, command):
    """A binary or Latin-1 file used to end `report` and `validate` with a traceback (UnicodeDecodeError)."""
    path = tmp_path / "results.json"
    data = b'{"schema_version": 1, "platform": {"name": "caf\xe9"}}'
    path.write_bytes(data)
    argv = {"merge": ["merge", str(path), "-o", str(tmp_path / "all.json")],
            "compare": ["compare", str(path), str(path)]}.get(command, [command, str(path)])
    _one_line_error(capsys, argv, f"{path}: not a results file: not UTF-8 text (byte 0xe9 at offset "
                                  f"{data.index(0xe9)})")
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"results": []}).encode())   # a byte-order mark is no problem
    assert load_results(str(path)) == {"results": []}


@pytest.mark.parametrize("command", ("merge", "compare"))
def test_merge_and_compare_refuse_a_file_of_the_wrong_shape_in_one_line(tmp_path, capsys, command):
    path = tmp_path / "x.json"
    for doc, fragment in (({"results": 5}, "its 'results' is not a list"),
                          ({"results": [1]}, "results[0] is not a result"),
                          ({"results": [{"check": "numerics", "outcome": "GOOD"}]}, "results[0] is not a result"),
                          ({"results": [], "run": "x"}, "its 'run' block is not an object")):
        path.write_text(json.dumps(doc))
        argv = ["merge", str(path), "-o", str(tmp_path / "all.json")] if command == "merge" else \
            ["compare", str(path), str(path)]
        _one_line_error(capsys, argv, f"{path}: not a results file: {fragment}")
    assert not (tmp_path / "all.json").exists()


def test_report_of_a_wrong_shape_file_is_one_line_and_validate_lists_its_problems(tmp_path, capsys):
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"a": 1}))
    _one_line_error(capsys, ["report", str(path)], str(path), "cannot render it", "missing")
    assert main(["validate", str(path)]) == ExitCode.FAILED
    assert "problems" in capsys.readouterr().out


def _results_without_results(path: Path, expected: int) -> Path:
    """A results file of a quick run with no results written: complete (and CONFORMANT) when `expected` is 0, else
    INCOMPLETE."""
    complete = expected == 0
    path.write_text(json.dumps({
        "schema_version": 1, "platform": {"name": "p", "class": "m.P", "device_type": "cpu"},
        "environment": {"python": "3.11", "torch": "2.13.0", "reference_impl": "0.1.0", "seed": 1},
        "run": RunInfo("quick", 1, expected_results=expected).to_json(0, complete),
        "results": [], "summary": {}, "verdict": "CONFORMANT" if complete else "NOT_CONFORMANT"}))
    return path


def test_validate_fails_an_incomplete_file_and_passes_a_complete_one(tmp_path, capsys):
    path = _results_without_results(tmp_path / "r.json", expected=4)
    assert main(["validate", str(path)]) == ExitCode.FAILED
    assert "valid schema, but INCOMPLETE: 0 of 4 expected results written" in capsys.readouterr().out
    _results_without_results(path, expected=0)
    assert main(["validate", str(path)]) == ExitCode.OK
    assert capsys.readouterr().out.startswith("valid; complete run, level quick")


def test_repro_with_unknown_check_or_platform_is_one_line(capsys):
    _one_line_error(capsys, ["repro", "--platform", "cpu", "--check", "numerics.nosuch"],
                    "unknown --check 'numerics.nosuch'", "numerics.ir_case")
    _one_line_error(capsys, ["repro", "--platform", "nosuch", "--check", "numerics.ir_case"],
                    "cannot activate --platform=nosuch", "unknown platform 'nosuch'")


@pytest.mark.parametrize("flag, value, fragment", [
    ("--case", "tokens=9,hidden=9", "unknown --case 'tokens=9,hidden=9' for numerics.ir_case on platform 'cpu'"),
    ("--op", "rms_normm", "unknown --op 'rms_normm'"),
])
def test_repro_with_unknown_value_names_it_in_one_line(tmp_path, flag, value, fragment):
    args = {"--op": "rms_norm", "--provider": "cpp", "--dtype": "float32", "--case": "tokens=7,hidden=769", flag: value}
    cmd = [sys.executable, "-m", "conformance", "repro", "--platform", "cpu", "--check", "numerics.ir_case"]
    cmd += [w for kv in args.items() for w in kv]
    env = {k: v for k, v in os.environ.items() if k != "REFERENCE_IMPL_PLUGINS"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == ExitCode.USAGE_ERROR, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "valid:" in lines[0], proc.stderr
    assert proc.stdout == ""


def test_the_file_commands_start_without_torch(tmp_path):
    """report, validate and compare read results files: a CI step that runs them pays no torch import (they took
    1.9 s, 0.06-0.2 s without it). Only repro, which runs checks, and its help, which lists every family's checks,
    import it."""
    path = _results_without_results(tmp_path / "r.json", expected=0)
    probe = "import sys; from conformance.cli import main; print([main(a) for a in {}], 'torch' in sys.modules)"
    commands = [["validate", str(path)], ["report", str(path), "-o", str(tmp_path / "r.html")],
                ["report", str(path)], ["compare", str(path), str(path)]]
    proc = subprocess.run([sys.executable, "-c", probe.format(commands)], capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines()[-1] == "[0, 0, 0, 0] False", proc.stdout + proc.stderr
    assert (tmp_path / "r.html").stat().st_size > 0
    proc = subprocess.run([sys.executable, "-c", "import sys; from conformance.cli import main\ntry: main(['repro', "
                           "'--help'])\nexcept SystemExit: print('torch' in sys.modules)"], capture_output=True,
                          text=True, timeout=120)
    assert "numerics.ir_case" in proc.stdout and proc.stdout.splitlines()[-1] == "True", proc.stdout + proc.stderr
