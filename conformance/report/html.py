"""`conformance report A.json [B.json ...] -o report.html|.md`: the report of one or several results files.

HTML: one self-contained page (conformance.report.html_template) with, per platform, the verdict, the
scorecard, the heatmap, the worst cases with their repro commands, coverage and the environment,
and for several files the compatibility matrix. Markdown: each file's report
(conformance.report.scorecard.render_markdown) and, for several files, the matrix. Deterministic output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import re

import jinja2
import markupsafe

from conformance.report.html_template import CSS, TEMPLATE
from conformance.report.matrix import matrix, render_markdown as matrix_markdown, totals
from conformance.report.scorecard import LEGEND, render_markdown as file_markdown
from conformance.report.labels import run_labels
from conformance.report.view import outcome_css, platform_view
from conformance.results.result import Outcome

COVERAGE_PARTS = [("implemented (providers)", "implemented"), ("native fallback", "fallback"),
                  ("replaced layers", "replaced"), ("layers left to the in-tree class", "not_replaced"),
                  ("not covered (the runtime has them, the catalog has nothing to grade them against)",
                   "not_covered"),
                  ("upstream code graded apart, not counted (not the distribution under test)", "upstream")]


SHORT_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}


def short_dtype(name: str) -> str:
    """A heatmap column header: 'bf16' for bfloat16 (the full name is its tooltip), other names as they are."""
    return SHORT_DTYPES.get(name, name)


class _Legend:
    def __init__(self, outcome: Outcome):
        self.name, self.css = outcome.value, outcome_css(outcome)


def wbr(name: object) -> markupsafe.Markup:
    """`name` escaped, with a line-break opportunity after each '.' and '_': a long qualified class or op name
    wraps inside its cell instead of widening the table past the window."""
    return markupsafe.Markup(re.sub(r"([._])", r"\1<wbr>", str(markupsafe.escape(name))))


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters["wbr"] = wbr
    return env


def render_html(files: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """The page for (path, document) pairs."""
    named = run_labels(files)
    views = [platform_view(label, doc) for label, (_, doc) in zip(named.columns, files)]
    columns, rows = matrix([(v.label, v.results) for v in views])
    title = ("Conformance report: " + views[0].label if len(views) == 1
             else "Conformance reports: " + (f"{named.common}: " if named.common else "")
             + " vs ".join(v.label for v in views))
    return _environment().from_string(TEMPLATE).render(
        title=title, columns_differ_in=", ".join(named.differ), css=CSS, views=views, outcomes=[_Legend(o) for o in Outcome], scorecard_legend=LEGEND,
        matrix_columns=columns, matrix_rows=rows, matrix_totals=totals(rows, len(columns)),
        coverage_parts=COVERAGE_PARTS, short_dtype=short_dtype)


def render_markdown(files: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """One file: its markdown report as before; several: what they share, the matrix, then each file's report,
    its heading naming the file as its column does."""
    parts = [file_markdown(doc) for _, doc in files]
    if len(files) == 1:
        return parts[0]
    from conformance.results.result import CheckResult

    named = run_labels(files)
    platforms = [(label, [CheckResult.from_json(r) for r in doc["results"]])
                 for label, (_, doc) in zip(named.columns, files)]
    head = ["# Compatibility reports", ""]
    if named.common:
        head += [f"All runs: {named.common}; the columns differ in {', '.join(named.differ)}.", ""]
    # each file's report under the name its matrix column has, so two reports of one platform name differ
    named_parts = [f"{first}: {label}\n{rest}" for (first, _, rest), label
                   in zip((part.partition("\n") for part in parts), named.columns)]
    return "\n".join([*head, matrix_markdown(platforms), *named_parts])


def render(files: Sequence[tuple[str, dict[str, Any]]], fmt: str) -> str:
    """The report of (path, document) pairs in `fmt` ('html' or 'markdown')."""
    return render_html(files) if fmt == "html" else render_markdown(files)


def format_for(output: str | None) -> str | None:
    """'html' or 'markdown' from the output's suffix (stdout: markdown); None for an unknown suffix."""
    if output is None or output.lower().endswith((".md", ".markdown")):
        return "markdown"
    if output.lower().endswith((".html", ".htm")):
        return "html"
    return None
