"""What the HTML report shows of one results file: verdict, heatmap, worst cases, coverage, environment.

Plain data built from the results (no markup here); `conformance.report.html` renders it. The
heatmap has one row per (op, provider), one column per (family, dtype); a cell holds the worst
outcome, the outcome counts and the worst error-to-tolerance ratio: the results' own `err_to_tol`,
the number their messages quote (`conformance.judge.tolerances`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from typing import Any

from conformance.judge.tolerances import ratio_text
from conformance.report.scorecard import (FAMILY_COLUMNS, IR_FAMILIES, coverage_scope, is_layer_result,
                                          is_not_covered_result, row_label, scorecard_rows, split_upstream,
                                          upstream_heading, upstream_note)
from conformance.results.result import CONFORMANT, CheckResult, Outcome, is_upstream, summarize

DTYPE_ORDER = ("float32", "float16", "bfloat16")
NO_DTYPE = "-"
WORST_LISTED = 15
NOT_JUDGED = frozenset({Outcome.NOT_IMPLEMENTED, Outcome.NOT_SUPPORTED, Outcome.SKIP})


def outcome_css(outcome: Outcome) -> str:
    """The stylesheet class of an outcome's colour: 'o-quality-warning'."""
    return "o-" + outcome.value.lower().replace("_", "-")


@dataclasses.dataclass
class Cell:
    outcome: Outcome             # the worst outcome that judged an implementation, if any did
    counts: dict[str, int]
    ratio: float | None          # worst err_to_tol of the cell's results (conformance.judge.tolerances)
    abs_err: float | None        # worst max_abs_err, shown where no result has an err_to_tol
    upstream: bool = False       # a row of upstream code (origin.upstream): its failures are not the code under test's

    @property
    def css(self) -> str:
        css = "o-upstream" if self.upstream and self.outcome.blocks_conformance else outcome_css(self.outcome)
        not_judged = any(Outcome(o) in NOT_JUDGED for o in self.counts)
        return css + (" some-not-judged" if not_judged and self.outcome not in NOT_JUDGED else "")

    @property
    def text(self) -> str:
        if self.ratio is not None:
            return f"{self.ratio:.3g}"
        if self.abs_err is not None:
            return f"abs {self.abs_err:.1e}"
        return f"n={sum(self.counts.values())}"

    @property
    def title(self) -> str:
        counts = ", ".join(f"{n} {o}" for o, n in self.counts.items())
        extra = (f"; worst error / tolerance {ratio_text(self.ratio)}" if self.ratio is not None
                 else f"; worst abs err {self.abs_err:.3g}" if self.abs_err is not None else "")
        return counts + extra


@dataclasses.dataclass
class Case:
    result: CheckResult
    ratio: float | None

    @property
    def css(self) -> str:
        return outcome_css(self.result.outcome)

    @property
    def ratio_text(self) -> str:
        return ratio_text(self.ratio) if self.ratio is not None else ""


@dataclasses.dataclass
class PlatformView:
    label: str
    doc: dict[str, Any]
    results: list[CheckResult]
    verdict_text: str
    verdict_css: str
    summary: dict[str, int]
    scorecard: tuple[list[str], list[list[str]]]
    columns: list[tuple[str, str]]                      # (family, dtype)
    heatmap: list[tuple[str, str, list[Cell | None]]]   # (op label, provider, cells)
    worst: list[Case]
    closest: list[Case]                                 # passing cases nearest their tolerance
    coverage: dict[str, list[str]]
    coverage_scope: str | None                          # what an incomplete or narrowed run's coverage counts
    environment: list[tuple[str, str]]
    upstream_heading: str | None = None                 # upstream code graded apart (conformance.collect.origin)
    upstream_scorecard: tuple[list[str], list[list[str]]] | None = None
    upstream_worst: list[Case] = dataclasses.field(default_factory=list)


    @property
    def chips(self) -> list[tuple[str, str]]:
        """('1442 PASS', 'o-pass') per outcome that occurred."""
        return [(f"{n} {name}", outcome_css(Outcome(name))) for name, n in self.summary.items()]

    @property
    def families(self) -> list[tuple[str, int]]:
        """(family, number of its dtype columns), for the heatmap's first header row."""
        out: list[tuple[str, int]] = []
        for family, _ in self.columns:
            if out and out[-1][0] == family:
                out[-1] = (family, out[-1][1] + 1)
            else:
                out.append((family, 1))
        return out


def _ratio(r: CheckResult) -> float | None:
    """The result's error-to-tolerance ratio as its check computed it (None in files written before it was)."""
    return r.err_to_tol


def verdict_label(doc: dict[str, Any]) -> tuple[str, str]:
    """The verdict as shown, and its css class, by the scorecard's rule and wording (`report.verdict_text`):
    never a plain CONFORMANT for an incomplete or narrowed run, or a file that says nothing of what it covers."""
    from conformance.report.scorecard import verdict_text
    from conformance.results.schema import run_status

    complete, partial, line = run_status(doc)
    verdict = str(doc.get("verdict"))
    results = [CheckResult.from_json(r) for r in doc.get("results", []) if isinstance(r, dict)]
    gate = bool((doc.get("run") or {}).get("gate_upstream"))
    text = verdict_text(verdict, complete, partial) + upstream_note(split_upstream(results)[1], gate)
    if not complete or partial:
        return f"{text}: {line}", "v-bad" if not complete else "v-partial"
    return text, "v-good" if verdict == CONFORMANT else "v-bad"


def _row_group(label: str) -> int:
    """IR ops first, then CustomOp replacements, then the model."""
    return 2 if label.endswith("(model)") else 1 if label.endswith("(CustomOp)") else 0


def _heatmap(results: list[CheckResult]):
    cells: dict[tuple[str, str], dict[tuple[str, str], list[CheckResult]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.outcome is Outcome.NOT_IMPLEMENTED or is_not_covered_result(r):   # shown under coverage, not as a row
            continue
        provider = (r.provider or NO_DTYPE) + (" (upstream)" if is_upstream(r) else "")
        cells[(row_label(r), provider)][(r.family, r.dtype or NO_DTYPE)].append(r)
    present = {col for row in cells.values() for col in row}
    families = [f for f in FAMILY_COLUMNS if any(c[0] == f for c in present)]
    families += sorted({c[0] for c in present} - set(families))
    dtypes = [d for d in DTYPE_ORDER if any(c[1] == d for c in present)]
    dtypes += sorted({c[1] for c in present} - set(dtypes) - {NO_DTYPE}) + [NO_DTYPE]
    columns = [(f, d) for f in families for d in dtypes if (f, d) in present]
    rows = []
    for (label, provider), row in sorted(cells.items(), key=lambda kv: (_row_group(kv[0][0]), kv[0])):
        out: list[Cell | None] = []
        for col in columns:
            group = row.get(col)
            if not group:
                out.append(None)
                continue
            ratios = [x for x in map(_ratio, group) if x is not None]
            errs = [r.max_abs_err for r in group if r.max_abs_err is not None]
            counts = {o.value: n for o, n in sorted(Counter(r.outcome for r in group).items(),
                                                     key=lambda kv: -kv[0].severity)}
            judged = [r.outcome for r in group if r.outcome not in NOT_JUDGED] or [r.outcome for r in group]
            out.append(Cell(max(judged, key=lambda o: o.severity), counts,
                            max(ratios) if ratios else None, None if ratios or not errs else max(errs),
                            provider.endswith(" (upstream)")))
        rows.append((label, provider, out))
    return columns, rows


def _coverage(results: list[CheckResult]) -> dict[str, list[str]]:
    ir = [r for r in results if not is_layer_result(r) and r.family in IR_FAMILIES]
    fallback = sorted({r.op for r in ir if r.outcome is Outcome.NOT_IMPLEMENTED and r.op})
    implemented = sorted({r.op for r in ir if r.provider and r.op and not is_upstream(r)} - set(fallback))
    providers = defaultdict(set)
    for r in ir:
        if r.provider and r.op and not is_upstream(r):
            providers[r.op].add(r.provider)
    layers = [r for r in results if is_layer_result(r)]
    not_replaced = sorted({r.op for r in layers if r.outcome is Outcome.NOT_IMPLEMENTED and r.op})
    replaced = sorted({f"{r.op} -> {r.provider}" for r in layers if r.provider and r.op and not is_upstream(r)})
    upstream = sorted({f"{r.op} -> {r.provider}" + (" (CustomOp)" if is_layer_result(r) else "")
                       for r in results if is_upstream(r) and r.provider and r.op})
    not_covered = sorted({f"{r.op} ({r.case})" for r in results if is_not_covered_result(r)})
    return {"implemented": [f"{op} ({', '.join(sorted(providers[op]))})" for op in implemented],
            "fallback": fallback, "replaced": replaced, "not_replaced": not_replaced, "not_covered": not_covered,
            "upstream": upstream}


def _environment(doc: dict[str, Any]) -> list[tuple[str, str]]:
    plat, env, run = doc.get("platform") or {}, doc.get("environment") or {}, doc.get("run") or {}
    rows = [("platform", str(plat.get("name"))), ("platform class", str(plat.get("class"))),
            ("device type", str(plat.get("device_type")))]
    if env.get("vllm"):
        rows.append(("vLLM release", str(env["vllm"])))
    for key in ("device_name", "driver", "torch", "triton", "python", "reference_impl", "seed"):
        if key in env:
            rows.append((key.replace("_", " "), "unknown" if env[key] is None else str(env[key])))
    if "plugin" in env:
        plugin = env["plugin"]
        rows.append(("plugin", f"{plugin.get('distribution')} {plugin.get('version')}"
                     if isinstance(plugin, dict) else "built-in"))
    for key in sorted(set(env) - {"device_name", "driver", "torch", "triton", "python", "reference_impl",
                                  "seed", "plugin", "vllm"}):
        rows.append((key, str(env[key])))
    if run:
        selection = run.get("selection") or {}
        narrowed = ", ".join(f"{k}={selection[k]}" for k in ("keyword", "markexpr", "shard") if selection.get(k))
        rows += [("level", str(run.get("level"))), ("selection", narrowed or "the whole catalog"),
                 ("results written", f"{run.get('written_results')} of {run.get('expected_results')} expected")]
    return rows


def platform_view(label: str, doc: dict[str, Any]) -> PlatformView:
    results = [CheckResult.from_json(r) for r in doc.get("results", [])]
    text, css = verdict_label(doc)
    columns, heatmap = _heatmap(results)
    own, upstream = split_upstream(results)
    ranked = [Case(r, _ratio(r)) for r in own]
    passing = sorted((c for c in ranked if c.result.outcome is Outcome.PASS and c.ratio is not None),
                     key=lambda c: (-(c.ratio or 0.0), c.result.nodeid or ""))
    gate = bool((doc.get("run") or {}).get("gate_upstream"))
    return PlatformView(label, doc, results, text, css, summarize(results), scorecard_rows(own), columns,
                        heatmap, _bad(own)[:WORST_LISTED], passing[:5], _coverage(results),
                        coverage_scope(doc.get("run")), _environment(doc),
                        upstream_heading(upstream, gate) if upstream else None,
                        scorecard_rows(upstream) if upstream else None, _bad(upstream)[:WORST_LISTED])


def _bad(results: list[CheckResult]) -> list[Case]:
    """The failing, waived and warned cases of `results`, worst first."""
    bad = [Case(r, _ratio(r)) for r in results if r.outcome.blocks_conformance
           or r.outcome in (Outcome.XPASS, Outcome.QUALITY_WARNING, Outcome.XFAIL)]
    bad.sort(key=lambda c: (-c.result.outcome.severity, -(c.ratio or 0.0), c.result.nodeid or ""))
    return bad

