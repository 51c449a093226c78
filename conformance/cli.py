"""The `conformance` command line: `repro` reruns one check in-process, `report` renders a results file.

    python -m conformance repro --platform NAME --check numerics.ir_case --op rms_norm --provider p \
        --dtype bfloat16 --case 'tokens=7,hidden=769' --seed 1234 --level standard   # [--draw '...'] [--in-process]
    python -m conformance report results.json [more.json ...] [-o report.html|report.md]
    python -m conformance validate results.json
    python -m conformance publish --platform cpu      # reruns the harness, writes reports/cpu.{json,md,html}
    python -m conformance merge s1.json s2.json -o all.json      # join the files of --conformance-shard runs
    python -m conformance compare old.json new.json [--markdown pr.md]   # exit 1 on regressions

Every error that is the caller's (a missing or truncated file, an unknown platform, check, op,
provider, dtype or case) is one line on stderr naming the file or value, with exit status 4; the
exit codes are those of conformance.exit_codes, the same as `pytest --platform=NAME`.
"""

from __future__ import annotations

import argparse
import sys

from conformance.collect.units import DEFAULT_SEED, LEVELS
from conformance.exit_codes import ExitCode
from conformance.exit_codes import table as exit_code_table


class UsageError(Exception):
    """A caller's mistake: printed as one line, exit status USAGE_ERROR."""


def check_names() -> list[str]:
    from conformance.checks import registry

    return sorted(registry())


def find_unit(inventory, family: str, check: str, fields: dict[str, str | None]):
    """The catalog unit with these fields (at level full); UsageError naming the first value that matches none."""
    from conformance.checks import units
    from conformance.collect.units import Unit

    unit = Unit(family, check, **fields)
    catalog = units(inventory, family, check, "full")
    if unit in catalog:
        return unit
    candidates = catalog
    for name in ("op", "provider", "dtype", "case"):
        valid = sorted({getattr(u, name) or "" for u in candidates})
        matching = [u for u in candidates if getattr(u, name) == fields[name]]
        if not matching:
            given = fields[name]
            shown = ", ".join(v for v in valid[:12] if v) + (f" ... ({len(valid)} in all)" if len(valid) > 12 else "")
            if given is None:
                raise UsageError(f"{family}.{check} on platform '{inventory.name}' needs --{name} (one of: {shown})")
            raise UsageError(f"unknown --{name} {given!r} for {family}.{check} on platform '{inventory.name}'"
                             + (f" (valid: {shown})" if shown else f": the platform brings nothing {check} checks"))
        candidates = matching
    raise UsageError(f"no {family}.{check} unit matches {fields}")   # unreachable: every field matched


def _repro(args) -> int:
    if args.check not in check_names():
        raise UsageError(f"unknown --check {args.check!r}; valid: {', '.join(check_names())}")
    if args.draw is not None:
        from conformance.collect.draws import DrawSyntaxError, parse_draw

        if args.check != "numerics.ir_property":
            raise UsageError(f"--draw replays a hypothesis draw of numerics.ir_property, not of {args.check}")
        try:
            parse_draw(args.draw)
        except DrawSyntaxError as exc:
            raise UsageError(f"--draw: {exc}") from None
    if args.in_process:
        return _repro_here(args)
    from conformance.run.repro_supervisor import supervise

    words = ["repro", "--platform", args.platform, "--check", args.check, "--seed", str(args.seed), "--level", args.level]
    for flag, value in (("--op", args.op), ("--provider", args.provider), ("--dtype", args.dtype),
                        ("--case", args.case), ("--draw", args.draw)):
        if value is not None:
            words += [flag, value]
    return supervise(words + ["--in-process"])


def _repro_here(args) -> int:
    """The unit in this process (what the supervised child runs, and what a debugger wants)."""
    import faulthandler

    from conformance.results import running_note
    from conformance.checks import CheckContext, run_unit
    from conformance.collect.inventory import PlatformSetupError, activate
    from conformance.results.result import Outcome
    from conformance.run.tool_state import redirect_tool_state
    from conformance.run.worker import enable_crash_stacks

    enable_crash_stacks(faulthandler)
    running_note.open_from_environment()
    family, _, check = args.check.partition(".")
    try:
        inventory = activate(args.platform)
    except PlatformSetupError as exc:
        raise UsageError(str(exc)) from None
    fields = {"op": args.op, "provider": args.provider, "dtype": args.dtype, "case": args.case}
    redirect_tool_state(args)  # hypothesis draws leave no .hypothesis/ in the current directory
    unit = find_unit(inventory, family, check, fields)
    ctx = CheckContext(args.platform, inventory.platform, seed=args.seed, level=args.level, draw=args.draw)
    running_note.start_unit(unit.to_dict())
    verdict, duration = run_unit(ctx, unit)
    print(f"{verdict.outcome.value}  {family}.{check} {unit.id}  ({duration:.3f} s)")
    if verdict.message:
        print(verdict.message)
    blocks = verdict.outcome.blocks_conformance or verdict.outcome is Outcome.XPASS
    return ExitCode.FAILED if blocks else ExitCode.OK


def _load(path: str) -> dict:
    from conformance.results.result import ResultsFileError, load_results

    try:
        return load_results(path)
    except ResultsFileError as exc:
        raise UsageError(str(exc)) from None


def _report(args) -> int:
    from conformance.report.html import format_for, render
    from conformance.results.schema import validate

    fmt = format_for(args.output)
    if fmt is None:
        raise UsageError(f"{args.output}: cannot tell the report format from the name: use .html or .md")
    files = [(path, _load(path)) for path in args.results]
    try:
        text = render(files, fmt)
    except (KeyError, TypeError, ValueError, AttributeError):
        bad = next(((path, validate(doc)) for path, doc in files if validate(doc)), None)
        path, problems = bad if bad else (", ".join(args.results), ["its fields are not those of a results file"])
        raise UsageError(f"{path}: cannot render it: {problems[0]}"
                         + (f" (and {len(problems) - 1} more problems: run conformance validate)"
                            if len(problems) > 1 else "")) from None
    if args.output:
        try:
            with open(args.output, "w") as fh:
                fh.write(text)
        except OSError as exc:
            raise UsageError(f"{args.output}: cannot write the report ({exc.strerror})") from None
    else:
        print(text)
    return ExitCode.OK


def _validate(args) -> int:
    from conformance.results.schema import run_status, validate

    doc = _load(args.results)
    errors = validate(doc)
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} problems")
        return ExitCode.FAILED
    complete, partial, line = run_status(doc)
    if not complete:   # schema-valid, yet no CI step may pass on a run that did not finish
        print(f"valid schema, but {line}")
        return ExitCode.FAILED
    print(f"valid; {line}")
    return ExitCode.OK


def _publish(args) -> int:
    """Run the harness for one platform and write `<dir>/<platform>.json`, `.md` and `.html`."""
    import os
    import subprocess

    from conformance.report.scorecard import render_markdown

    os.makedirs(args.dir, exist_ok=True)
    json_path = os.path.join(args.dir, f"{args.platform}.json")
    cmd = [sys.executable, "-m", "pytest", f"--platform={args.platform}", f"--conformance-json={json_path}",
           f"--conformance-level={args.level}", "-p", "no:cacheprovider", "-q", *args.pytest_args]
    rc = subprocess.call(cmd)
    if not os.path.exists(json_path):
        print(f"the harness wrote no results file {json_path} (exit status {rc})", file=sys.stderr)
        return rc or ExitCode.USAGE_ERROR
    with open(os.path.join(args.dir, f"{args.platform}.md"), "w") as fh:
        fh.write(render_markdown(_load(json_path)))
    from conformance.report.html import render_html

    with open(os.path.join(args.dir, f"{args.platform}.html"), "w") as fh:
        fh.write(render_html([(json_path, _load(json_path))]))
    return rc


def _merge(args) -> int:
    """Join the shards' files (conformance.gate.merge); a file that cannot be read, or shards that cannot be
    merged, exit USAGE_ERROR (nothing was judged) and nothing is written."""
    from conformance.gate.merge import MergeError, merge_documents
    from conformance.results.result import ResultsFileError, load_results, require_results_shape, write_json_atomically

    try:
        docs = [(p, require_results_shape(p, load_results(p))) for p in args.results]
        merged = merge_documents(docs)
    except ResultsFileError as exc:
        print(f"conformance merge: {exc}", file=sys.stderr)
        return ExitCode.USAGE_ERROR
    except MergeError as exc:
        print(f"conformance merge: not merged, {len(exc.problems)} problems:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return ExitCode.USAGE_ERROR
    try:
        write_json_atomically(args.output, merged)
    except OSError as exc:
        raise UsageError(f"{args.output}: cannot write the merged file ({exc.strerror or exc})") from None
    summary = ", ".join(f"{v} {k}" for k, v in merged["summary"].items()) or "no results"
    print(f"merged {len(args.results)} shards into {args.output}: {len(merged['results'])} results ({summary}); "
          f"verdict {merged['verdict']}")
    return ExitCode.OK


def _compare(args) -> int:
    """What changed between two files (conformance.gate.compare); FAILED when there are regressions. Files of two
    platforms are refused (USAGE_ERROR, conformance.gate.comparable): nothing of one can be matched in the other."""
    from conformance.gate.comparable import NotComparable
    from conformance.gate.compare import compare, render_markdown, render_text
    from conformance.results.result import ResultsFileError, load_results, require_results_shape

    try:
        old = require_results_shape(args.old, load_results(args.old))
        new = require_results_shape(args.new, load_results(args.new))
        result = compare(old, new, args.old, args.new)
    except (ResultsFileError, NotComparable) as exc:
        print(f"conformance compare: {exc}", file=sys.stderr)
        return ExitCode.USAGE_ERROR
    print(render_text(result))
    if args.markdown:
        try:
            with open(args.markdown, "w") as fh:
                fh.write(render_markdown(result))
        except OSError as exc:
            raise UsageError(f"{args.markdown}: cannot write the markdown summary ({exc.strerror or exc})") from None
    return ExitCode.FAILED if result.regressions else ExitCode.OK


class _Parser(argparse.ArgumentParser):
    """argparse with exit status USAGE_ERROR (not argparse's 2, which means INTERRUPTED in the table)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(ExitCode.USAGE_ERROR, f"{self.prog}: error: {message}\n")


def build_parser(command: str | None = "repro") -> argparse.ArgumentParser:
    """The parser of every subcommand; `repro --help` lists the check names, which imports every check family (and
    torch, about 1.3 s), so they are listed only when `command` is repro (the other commands start without torch)."""
    common = {"epilog": exit_code_table(), "formatter_class": argparse.RawDescriptionHelpFormatter}
    parser = _Parser(prog="conformance", description="platform conformance harness tools", **common)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    repro = sub.add_parser("repro", help="rerun one check in this process and print its outcome",
                           description="Rerun one check (one result of a run) in this process and print its "
                                       "outcome. Every result's `repro` field is such a command.", **common)
    repro.add_argument("--platform", required=True, help="built-in platform or platform-plugin entry-point name")
    repro.add_argument("--check", required=True, metavar="FAMILY.CHECK",
                       help="the check to run" + (", one of: " + ", ".join(check_names()) if command == "repro"
                                                  else " (`conformance repro --help` lists them)"))
    repro.add_argument("--op", help="IR op name, or the CustomOp's registered name, as in the result")
    repro.add_argument("--provider", help="IR provider name, or the replacement class name, as in the result")
    repro.add_argument("--dtype", help="dtype name, e.g. float32 or bfloat16")
    repro.add_argument("--case", help="the case name as in the result, e.g. 'tokens=7,hidden=769'")
    repro.add_argument("--draw", help="numerics.ir_property only: rerun this one hypothesis draw (as the result's "
                                      "repro names it, e.g. 'rows=Rows(tokens=3, width=97, scale=1.0, layout=None)')")
    repro.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the inputs (default %(default)s)")
    repro.add_argument("--level", choices=LEVELS, default="standard", help="conformance level (default %(default)s)")
    repro.add_argument("--in-process", action="store_true",
                       help="run the check in this process (for a debugger); by default it runs in a child process, "
                            "so a crash is reported in one line naming the signal, with the stacks")
    repro.set_defaults(fn=_repro)
    report = sub.add_parser("report", help="render results files as a compatibility report (HTML or markdown)",
                            description="Render one or more results files (--conformance-json) as a compatibility "
                                        "report: per platform the verdict, scorecard, heatmap, worst cases, "
                                        "coverage and environment; several files add a matrix across platforms. An "
                                        "incomplete or narrowed run is marked as such.", **common)
    report.add_argument("results", nargs="+", help="one or more results files (JSON) written by pytest "
                                                  "--conformance-json")
    report.add_argument("-o", "--output", metavar="PATH",
                        help="write the report here; the suffix picks the format, .html (one self-contained page) "
                             "or .md (default: markdown printed to stdout)")
    report.set_defaults(fn=_report)
    validate = sub.add_parser("validate", help="check a results file against the schema of docs/results-file.md",
                              description="Check a results file against the schema (docs/results-file.md) "
                                          "and its own arithmetic; prints the problems, or 'valid' and whether the "
                                          "run is complete or a partial selection. A schema-valid file of an "
                                          "INCOMPLETE run exits 1 too.", **common)
    validate.add_argument("results", help="the results file (JSON) to check")
    validate.set_defaults(fn=_validate)
    publish = sub.add_parser("publish", help="run the harness and write the platform's published report",
                             description="Run the harness for one platform and write DIR/PLATFORM.json and "
                                         "DIR/PLATFORM.md; exits with the harness's exit status.", **common)
    publish.add_argument("--platform", required=True, help="built-in platform or platform-plugin entry-point name")
    publish.add_argument("--level", choices=LEVELS, default="standard", help="conformance level (default %(default)s)")
    publish.add_argument("--dir", default="reports", help="output directory (default %(default)s)")
    publish.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    publish.set_defaults(fn=_publish)
    merge = sub.add_parser("merge", help="join the results files of the shards of one run (--conformance-shard)",
                           description="Join the results files of the N shards of one run into one file with the "
                                       "results, summary and verdict of the unsharded run. Missing, repeated or "
                                       "overlapping shards, or shards of different runs, are refused (exit 4) and "
                                       "nothing is written.", **common)
    merge.add_argument("results", nargs="+", help="the shards' results files, one per shard I/N")
    merge.add_argument("-o", "--output", required=True, metavar="PATH", help="the merged results file to write")
    merge.set_defaults(fn=_merge)
    compare = sub.add_parser("compare", help="regressions, improvements, added and removed cases between two "
                                             "results files; exits 1 on regressions",
                             description="Compare a later results file with an earlier one: regressions (a PASS "
                                         "that became anything else, new failing cases), improvements, other "
                                         "changes, cases added or removed. Exit 1 when there are regressions; runs "
                                         "of two different platforms are refused (exit 4): nothing of one matches "
                                         "the other.",
                             **common)
    compare.add_argument("old", help="the earlier (baseline) results file")
    compare.add_argument("new", help="the later results file")
    compare.add_argument("--markdown", metavar="PATH",
                         help="also write a markdown summary for a pull-request comment (default: none)")
    compare.set_defaults(fn=_compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(next((w for w in words if not w.startswith("-")), None)).parse_args(argv)
    try:
        return int(args.fn(args))
    except UsageError as exc:
        print(f"conformance {args.command}: {exc}", file=sys.stderr)
        return ExitCode.USAGE_ERROR
    except BrokenPipeError:   # `report ... | head`: the reader left, nothing is wrong
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit's flush
        return ExitCode.OK
