"""The `conformance` command line: `repro` reruns one check in-process, `report` renders a results file.

    python -m conformance repro --platform NAME --check numerics.ir_case --op rms_norm --provider p \
        --dtype bfloat16 --case 'tokens=7,hidden=769' --seed 1234 --level standard
    python -m conformance report results.json [-o report.md]
    python -m conformance validate results.json
    python -m conformance publish --platform cpu      # reruns the harness, writes reports/cpu.{json,md}
"""

from __future__ import annotations

import argparse
import json
import sys

from conformance.units import DEFAULT_SEED, LEVELS


def _repro(args) -> int:
    from conformance.checks import CheckContext, run_unit
    from conformance.tool_state import redirect_tool_state
    from conformance.inventory import PlatformSetupError, activate
    from conformance.results import Outcome
    from conformance.units import Unit

    family, _, check = args.check.partition(".")
    if not check:
        print(f"--check must be family.check (e.g. numerics.ir_case), got {args.check!r}", file=sys.stderr)
        return 2
    try:
        inventory = activate(args.platform)
    except PlatformSetupError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    redirect_tool_state(args)  # hypothesis draws leave no .hypothesis/ in the current directory
    unit = Unit(family, check, args.op, args.provider, args.dtype, args.case)
    ctx = CheckContext(args.platform, inventory.platform, seed=args.seed, level=args.level)
    verdict, duration = run_unit(ctx, unit)
    print(f"{verdict.outcome.value}  {family}.{check} {unit.id}  ({duration:.3f} s)")
    if verdict.message:
        print(verdict.message)
    return 1 if verdict.outcome.blocks_conformance or verdict.outcome is Outcome.XPASS else 0


def _report(args) -> int:
    from conformance.report import render_markdown
    from conformance.results import load_results

    text = render_markdown(load_results(args.results))
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
    else:
        print(text)
    return 0


def _validate(args) -> int:
    from conformance.results import validate_document

    with open(args.results) as fh:
        errors = validate_document(json.load(fh))
    for e in errors:
        print(e)
    print("valid" if not errors else f"{len(errors)} problems")
    return 1 if errors else 0


def _publish(args) -> int:
    """Run the harness for one platform and write `<dir>/<platform>.json` and `<dir>/<platform>.md`."""
    import os
    import subprocess

    from conformance.report import render_markdown
    from conformance.results import load_results

    os.makedirs(args.dir, exist_ok=True)
    json_path = os.path.join(args.dir, f"{args.platform}.json")
    cmd = [sys.executable, "-m", "pytest", f"--platform={args.platform}", f"--conformance-json={json_path}",
           f"--conformance-level={args.level}", "-p", "no:cacheprovider", "-q", *args.pytest_args]
    rc = subprocess.call(cmd)
    if not os.path.exists(json_path):
        print(f"the harness wrote no results file (exit status {rc})", file=sys.stderr)
        return rc or 1
    with open(os.path.join(args.dir, f"{args.platform}.md"), "w") as fh:
        fh.write(render_markdown(load_results(json_path)))
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="conformance", description="platform conformance harness tools")
    sub = parser.add_subparsers(dest="command", required=True)
    repro = sub.add_parser("repro", help="rerun one check in this process and print its outcome")
    repro.add_argument("--platform", required=True)
    repro.add_argument("--check", required=True, help="family.check, e.g. numerics.ir_case")
    repro.add_argument("--op")
    repro.add_argument("--provider")
    repro.add_argument("--dtype")
    repro.add_argument("--case")
    repro.add_argument("--seed", type=int, default=DEFAULT_SEED)
    repro.add_argument("--level", choices=LEVELS, default="standard")
    repro.set_defaults(fn=_repro)
    report = sub.add_parser("report", help="render a results file as a markdown compatibility report")
    report.add_argument("results")
    report.add_argument("-o", "--output")
    report.set_defaults(fn=_report)
    validate = sub.add_parser("validate", help="check a results file against the schema of docs/results-file.md")
    validate.add_argument("results")
    validate.set_defaults(fn=_validate)
    publish = sub.add_parser("publish", help="run the harness and write the platform's published report")
    publish.add_argument("--platform", required=True)
    publish.add_argument("--level", choices=LEVELS, default="standard")
    publish.add_argument("--dir", default="reports")
    publish.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    publish.set_defaults(fn=_publish)
    args = parser.parse_args(argv)
    return args.fn(args)
