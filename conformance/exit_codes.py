"""The one exit-code table of `pytest --platform=NAME` and every `python -m conformance` subcommand.

The values are pytest's own (`pytest.ExitCode`), so a CI script reads a conformance run and a CLI
call alike: 4 always means "misconfigured, nothing was judged", never a verdict.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Exit statuses; equal in value and meaning to `pytest.ExitCode`."""

    OK = 0
    FAILED = 1
    INTERRUPTED = 2
    INTERNAL_ERROR = 3
    USAGE_ERROR = 4
    NO_TESTS_COLLECTED = 5
    MAX_WARNINGS_ERROR = 6


MEANINGS = {
    ExitCode.OK: "success: the run is CONFORMANT (for its selection; failures of upstream code, shown apart, do "
                 "not count unless `--conformance-gate-upstream`: [checks.md](checks.md#outcomes)), the file is "
                 "valid, the check held, the report was written",
    ExitCode.FAILED: "a verdict against the platform or the file: NOT_CONFORMANT, a baseline regression, a "
                     "results file that breaks the schema or comes from an INCOMPLETE run, a repro whose outcome "
                     "blocks conformance",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C): the results file says INCOMPLETE",
    ExitCode.INTERNAL_ERROR: "internal error of pytest or the harness (a bug: please report it)",
    ExitCode.USAGE_ERROR: "misconfiguration, nothing was judged: unknown platform or plugin that does not load, "
                          "an option value out of range, unreadable or wrong-shape waivers/baseline/results file, "
                          "a baseline or compared file of another platform, unknown check/op/case/dtype, "
                          "bad command-line arguments",
    ExitCode.NO_TESTS_COLLECTED: "the selection (-k, -m, paths) matched no check",
    ExitCode.MAX_WARNINGS_ERROR: "pytest only: more warnings than --max-warnings allows (each QUALITY_WARNING "
                                 "result is a warning)",
}


SHORT = {
    ExitCode.OK: "conformant (for the selection)", ExitCode.FAILED: "not conformant, regression or bad file",
    ExitCode.INTERRUPTED: "interrupted", ExitCode.INTERNAL_ERROR: "internal error",
    ExitCode.USAGE_ERROR: "misconfiguration (nothing judged)", ExitCode.NO_TESTS_COLLECTED: "nothing selected",
    ExitCode.MAX_WARNINGS_ERROR: "too many warnings",
}


def one_line() -> str:
    """The table in one line, for option help where a table does not fit."""
    return "exit codes: " + ", ".join(f"{int(code)} {SHORT[code]}" for code in ExitCode) + " (docs/exit-codes.md)"


def table() -> str:
    """The table as plain text, for --help epilogs and error messages."""
    lines = ["exit codes (pytest --platform=NAME and every conformance subcommand):"]
    lines += [f"  {int(code)}  {code.name:<18} {MEANINGS[code]}" for code in ExitCode]
    return "\n".join(lines)


def markdown_table() -> str:
    """The same table in markdown, as written in docs/exit-codes.md."""
    rows = ["| code | name | meaning |", "| --- | --- | --- |"]
    rows += [f"| {int(code)} | `{code.name}` | {MEANINGS[code]} |" for code in ExitCode]
    return "\n".join(rows)
