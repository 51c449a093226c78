"""The scorecard (terminal) and the markdown compatibility report, both from a list of results."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from tabulate import tabulate

from conformance.results import CheckResult, Outcome, summarize, verdict

FAMILY_COLUMNS = ("numerics", "aliasing", "compile", "dispatch", "model")
ABBREV = {
    Outcome.PASS: "P", Outcome.NOT_IMPLEMENTED: "NI", Outcome.NOT_SUPPORTED: "NS", Outcome.SKIP: "S",
    Outcome.XFAIL: "XF", Outcome.QUALITY_WARNING: "QW", Outcome.XPASS: "XP", Outcome.FAIL: "F",
    Outcome.ERROR: "E", Outcome.TIMEOUT: "T", Outcome.CRASH: "C",
}
LEGEND = "cells: count+outcome, " + ", ".join(f"{a}={o.value}" for o, a in ABBREV.items())


LAYER_TESTS = ("test_layer_case", "test_layer_coverage", "test_oot_registration", "test_oot_dispatch")


def is_layer_result(r: CheckResult) -> bool:
    """Whether a result is about a CustomOp layer (its `op` is then the registered layer name)."""
    name = (r.nodeid or "").rpartition("::")[2].partition("[")[0]
    return name in LAYER_TESTS


def row_label(r: CheckResult) -> str:
    op = r.op or "(platform)"
    if r.check == "model":
        return f"{op} (model)"
    return f"{op} (CustomOp)" if is_layer_result(r) else op


def _cell(counts: Counter) -> str:
    return " ".join(f"{counts[o]}{ABBREV[o]}" for o in sorted(counts, key=lambda o: -o.severity)) or "-"


def scorecard_rows(results: Sequence[CheckResult]) -> tuple[list[str], list[list[str]]]:
    families = list(FAMILY_COLUMNS) + sorted({r.check for r in results} - set(FAMILY_COLUMNS))
    table: dict[tuple[str, str], dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for r in results:
        table[(row_label(r), r.provider or "-")][r.check][r.outcome] += 1
    headers = ["op", "provider", *families]
    rows = []
    for (op, provider), cells in sorted(table.items(), key=lambda kv: (kv[0][1] == "-", kv[0])):
        rows.append([op, provider, *[_cell(cells.get(f, Counter())) for f in families]])
    return headers, rows


def coverage(results: Sequence[CheckResult], ir_ops: Sequence[str] | None = None) -> str:
    """'ops implemented / ops in the catalog' from the results (dispatch coverage marks the rest)."""
    results = [r for r in results if not is_layer_result(r) and r.check != "model"]
    not_impl = {r.op for r in results if r.outcome is Outcome.NOT_IMPLEMENTED}
    implemented = {r.op for r in results if r.provider and r.op and r.op not in not_impl}
    total = set(ir_ops) if ir_ops is not None else (implemented | not_impl)
    done = sorted(implemented & total) if ir_ops is not None else sorted(implemented)
    return (f"coverage: {len(done)} / {len(total)} IR ops implemented"
            + (f" ({', '.join(done)})" if done else "")
            + (f"; native fallback: {len(not_impl)}" if not_impl else ""))


def worst(results: Sequence[CheckResult], n: int = 8) -> list[CheckResult]:
    bad = [r for r in results if r.outcome.severity >= Outcome.XPASS.severity or r.outcome is Outcome.QUALITY_WARNING]
    return sorted(bad, key=lambda r: -r.outcome.severity)[:n]


def _first_line(text: str | None, limit: int = 220) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def render_scorecard(results: Sequence[CheckResult], *, platform: str, ir_ops: Sequence[str] | None = None,
                     layer_note: str | None = None, strict_xpass: bool = True,
                     regressions: Iterable[str] = ()) -> str:
    headers, rows = scorecard_rows(results)
    lines = [f"conformance scorecard: platform {platform}", tabulate(rows, headers=headers, tablefmt="simple"),
             LEGEND, coverage(results, ir_ops)]
    if layer_note:
        lines.append(layer_note)
    summary = summarize(results)
    lines.append("results: " + (", ".join(f"{v} {k}" for k, v in summary.items()) or "none"))
    top = worst(results)
    if top:
        lines.append("worst:")
        for r in top:
            lines.append(f"  {r.outcome.value:<15} {r.nodeid}\n                  {_first_line(r.message)}")
    regressions = list(regressions)
    if regressions:
        lines.append(f"regressions against the baseline: {len(regressions)}")
        lines += [f"  {x}" for x in regressions[:20]]
    lines.append(f"verdict: {verdict(results, strict_xpass=strict_xpass)}")
    return "\n".join(lines)


def render_markdown(doc: dict) -> str:
    """A compatibility report of one results file."""
    results = [CheckResult.from_json(r) for r in doc["results"]]
    plat, env = doc["platform"], doc["environment"]
    headers, rows = scorecard_rows(results)
    out = [f"# Compatibility report: `{plat['name']}`", "",
           f"- platform class: `{plat['class']}` (device type `{plat['device_type']}`)",
           f"- environment: Python {env['python']}, torch {env['torch']}, reference_impl {env['reference_impl']}, "
           f"seed {env['seed']}",
           f"- verdict: **{doc['verdict']}**",
           f"- {coverage(results)}", "",
           "## Outcomes", "", tabulate(sorted(doc["summary"].items()), headers=["outcome", "count"], tablefmt="github"),
           "", "## Scorecard", "", LEGEND, "", tabulate(rows, headers=headers, tablefmt="github"), ""]
    problems = [r for r in results if r.outcome.severity >= Outcome.XFAIL.severity]
    if problems:
        out += ["## Findings", ""]
        for r in sorted(problems, key=lambda r: -r.outcome.severity):
            out.append(f"- **{r.outcome.value}** `{r.nodeid}`: {_first_line(r.message, 400)}")
            if r.repro:
                out.append(f"  - repro: `{r.repro}`")
        out.append("")
    return "\n".join(out)
