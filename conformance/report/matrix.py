"""The compatibility matrix across platforms, op by op (like the ONNX backend scoreboard), as data and markdown.

One row per op label (IR op, `name (CustomOp)`, `name (model)`), one column per results file. A
cell counts the results that judged an implementation (PASS of those), and carries the worst
outcome; an op the platform leaves to native is `native`, one it does not list is `-`.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

from conformance.report.scorecard import row_label
from conformance.report.view import NOT_JUDGED, outcome_css
from conformance.results.result import CheckResult, Outcome


@dataclasses.dataclass
class MatrixCell:
    text: str
    outcome: Outcome | None     # the worst outcome among judged results; None for native / absent
    title: str

    @property
    def css(self) -> str:
        if self.outcome is None:
            return "o-not-implemented" if self.text == "native" else "o-absent"
        return outcome_css(self.outcome)


def _cell(results: list[CheckResult]) -> MatrixCell:
    if not results:
        return MatrixCell("-", None, "not in this run")
    judged = [r for r in results if r.outcome not in NOT_JUDGED]
    not_supported = sum(r.outcome is Outcome.NOT_SUPPORTED for r in results)
    if not judged:
        if all(r.outcome is Outcome.NOT_IMPLEMENTED for r in results):
            return MatrixCell("native", None, "not implemented: native fallback")
        return MatrixCell("n/s", Outcome.NOT_SUPPORTED, f"{not_supported} not supported, nothing judged")
    passed = sum(r.outcome is Outcome.PASS for r in judged)
    worst = max((r.outcome for r in judged), key=lambda o: o.severity)
    title = f"{passed} of {len(judged)} judged results PASS; worst {worst.value}"
    if not_supported:
        title += f"; {not_supported} not supported"
    return MatrixCell(f"{passed}/{len(judged)}", worst, title)


def matrix(platforms: Sequence[tuple[str, list[CheckResult]]]) -> tuple[list[str], list[tuple[str, list[MatrixCell]]]]:
    """(column labels, rows of (op label, cells)) for (label, results) per platform."""
    by_op: dict[str, list[list[CheckResult]]] = defaultdict(lambda: [[] for _ in platforms])
    for i, (_, results) in enumerate(platforms):
        for r in results:
            by_op[row_label(r)][i].append(r)
    order = sorted(by_op, key=lambda op: (op.endswith("(model)"), op.endswith("(CustomOp)"), op))
    return [label for label, _ in platforms], [(op, [_cell(rs) for rs in by_op[op]]) for op in order]


def totals(rows: list[tuple[str, list[MatrixCell]]], n: int) -> list[str]:
    """Per column: 'ops fully passing / ops judged'."""
    out = []
    for i in range(n):
        judged = [cells[i] for _, cells in rows if cells[i].outcome not in (None, Outcome.NOT_SUPPORTED)]
        clean = [c for c in judged if c.outcome is Outcome.PASS]
        out.append(f"{len(clean)}/{len(judged)}")
    return out


def render_markdown(platforms: Sequence[tuple[str, list[CheckResult]]]) -> str:
    columns, rows = matrix(platforms)
    esc = lambda s: str(s).replace("|", "/")  # noqa: E731 - a plugin name cannot split a cell
    lines = ["## Compatibility matrix", "",
             "cells: PASS / results that judged an implementation; `native`: not implemented (native fallback); "
             "`-`: not in that run", "",
             "| op | " + " | ".join(f"`{esc(c)}`" for c in columns) + " |",
             "| --- |" + " --- |" * len(columns)]
    for op, cells in rows:
        marks = [c.text + ("" if c.outcome in (None, Outcome.PASS) else f" {c.outcome.value}") for c in cells]
        lines.append(f"| {esc(op)} | " + " | ".join(marks) + " |")
    lines.append("| **ops fully passing** | " + " | ".join(totals(rows, len(columns))) + " |")
    return "\n".join(lines) + "\n"
