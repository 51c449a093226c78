"""The compatibility matrix across platforms, op by op (like the ONNX backend scoreboard), as data and markdown.

One row per op label (IR op, `name (CustomOp)`, `name (model)`), one column per results file. A
cell counts the results that judged an implementation (PASS of those), and carries the worst
outcome; an op the platform leaves to native is `native`, one it does not list is `-`. Failures of upstream
code (`origin.upstream`: vLLM's own kernels under a vendor's plugin) are not the vendor's: a cell whose
blocking failures are all upstream is drawn in the upstream style (`o-upstream`), not red, and a cell with
both says both counts ("2F +1F upstream").
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Sequence

from conformance.report.scorecard import ABBREV, row_label
from conformance.report.view import NOT_JUDGED, outcome_css
from conformance.results.result import CheckResult, Outcome, is_upstream


UPSTREAM_CSS = "o-upstream"


def _counts(outcomes: Counter) -> str:
    """'2F 1E': blocking outcomes by count, worst first, in the scorecard's abbreviations."""
    return " ".join(f"{n}{ABBREV[o]}" for o, n in sorted(outcomes.items(), key=lambda kv: -kv[0].severity))


@dataclasses.dataclass
class MatrixCell:
    text: str
    outcome: Outcome | None     # the worst outcome among judged results other than upstream failures; None for
    title: str                  # native / absent
    own_blocking: Counter = dataclasses.field(default_factory=Counter)        # the code under test's failures
    upstream_blocking: Counter = dataclasses.field(default_factory=Counter)   # upstream code's failures

    @property
    def upstream_only(self) -> bool:
        """Every blocking failure of the cell is upstream code's (and there is one)."""
        return bool(self.upstream_blocking) and not self.own_blocking

    @property
    def note(self) -> str:
        """'2F +1F upstream' where upstream code failed here, else '' (own failures alone are the colour)."""
        if not self.upstream_blocking:
            return ""
        own = _counts(self.own_blocking)
        return (own + " " if own else "") + f"+{_counts(self.upstream_blocking)} upstream"

    @property
    def css(self) -> str:
        if self.upstream_only:
            return UPSTREAM_CSS
        if self.outcome is None:
            return "o-not-implemented" if self.text == "native" else "o-absent"
        return outcome_css(self.outcome)

    @property
    def clean(self) -> bool:
        """Judged, all PASS, no failure of anyone's code."""
        return self.outcome is Outcome.PASS and not self.upstream_blocking


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
    own_blocking = Counter(r.outcome for r in judged if r.outcome.blocks_conformance and not is_upstream(r))
    upstream_blocking = Counter(r.outcome for r in judged if r.outcome.blocks_conformance and is_upstream(r))
    colouring = [r.outcome for r in judged if not (r.outcome.blocks_conformance and is_upstream(r))]
    worst = max(colouring or [Outcome.PASS], key=lambda o: o.severity)
    title = f"{passed} of {len(judged)} judged results PASS; worst {worst.value}"
    if upstream_blocking:
        title += (f"; upstream code (not the code under test) failed {sum(upstream_blocking.values())}: "
                  f"{_counts(upstream_blocking)}")
    if not_supported:
        title += f"; {not_supported} not supported"
    return MatrixCell(f"{passed}/{len(judged)}", worst, title, own_blocking, upstream_blocking)


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
        clean = [c for c in judged if c.clean]
        out.append(f"{len(clean)}/{len(judged)}")
    return out


def render_markdown(platforms: Sequence[tuple[str, list[CheckResult]]]) -> str:
    columns, rows = matrix(platforms)
    esc = lambda s: str(s).replace("|", "/")  # noqa: E731 - a plugin name cannot split a cell
    lines = ["## Compatibility matrix", "",
             "cells: PASS / results that judged an implementation, then the worst outcome of the code under test; "
             "`+1F upstream`: failures of upstream code (`origin.upstream`, e.g. vLLM's own kernels under a vendor "
             "plugin): not the code under test's; `native`: not implemented (native fallback); `-`: not in that run",
             "",
             "| op | " + " | ".join(f"`{esc(c)}`" for c in columns) + " |",
             "| --- |" + " --- |" * len(columns)]
    for op, cells in rows:
        marks = [c.text + ("" if c.outcome in (None, Outcome.PASS) else f" {c.outcome.value}")
                 + (f" ({c.note})" if c.note else "") for c in cells]
        lines.append(f"| {esc(op)} | " + " | ".join(marks) + " |")
    lines.append("| **ops fully passing** | " + " | ".join(totals(rows, len(columns))) + " |")
    return "\n".join(lines) + "\n"
