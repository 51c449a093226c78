"""`conformance compare OLD.json NEW.json`: what changed between two results files, for a CI gate and a PR comment.

Results are matched by `conformance.results.result.case_key`. A regression is a case that passed before
and is anything else now, or a case that blocks conformance now (FAIL, ERROR, TIMEOUT, CRASH, or
XPASS) and did not before, new cases included. An improvement is the reverse. Cases only in one
file are listed as added or removed. Files of two platforms are not compared at all (the command
refuses them, conformance.gate.comparable): every difference would read as a regression. Two runs of
the same platform name from different plugins, platform classes or vLLM releases are compared, with a
note saying so. A regression of upstream code (the later result's `origin.upstream`: vLLM's own code
under a vendor's plugin) is listed apart as not the vendor's, and fails nothing unless the later run
gated upstream code (`run.gate_upstream`), as for the verdict.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from conformance.gate.comparable import platform_name, release_change, require_same_platform
from conformance.results.result import CaseKey, Outcome, case_key, describe

BAD = frozenset({Outcome.FAIL, Outcome.ERROR, Outcome.TIMEOUT, Outcome.CRASH, Outcome.XPASS})
MAX_LISTED = 50
UPSTREAM = "upstream code, not your code; not gated: the later run did not use --conformance-gate-upstream"


@dataclasses.dataclass(frozen=True)
class Change:
    key: CaseKey
    before: Outcome | None   # None: the case is new
    after: Outcome | None    # None: the case is gone
    message: str | None = None

    def line(self) -> str:
        what = f"{self.before.value if self.before else 'new'} -> {self.after.value if self.after else 'removed'}"
        return f"{describe(self.key)}: {what}"


@dataclasses.dataclass
class Comparison:
    old_label: str
    new_label: str
    old_verdict: str | None
    new_verdict: str | None
    regressions: list[Change]
    improvements: list[Change]
    changed: list[Change]        # other outcome changes (e.g. FAIL -> ERROR, NOT_SUPPORTED -> NOT_IMPLEMENTED)
    added: list[Change]
    removed: list[Change]
    unchanged: int
    notes: list[str]             # the files differ in level, seed, plugin, class or vLLM release, or one is incomplete
    upstream_regressions: list[Change] = dataclasses.field(default_factory=list)   # upstream code's, not gated
    release_change: str | None = None   # "vLLM 0.30.0 before, vLLM 0.32.0 now" when the files' releases differ

    def regressions_title(self) -> str:
        """What the regressions are called: across a change of vLLM release they may be vLLM's, not the plugin's."""
        if self.release_change is None:
            return "regressions"
        return (f"regressions across a change of vLLM release ({self.release_change}): vLLM's change or the "
                "plugin's; a baseline made on the later release tells them apart")


def _classify(before: Outcome | None, after: Outcome | None) -> str:
    if after is None:
        return "removed"
    if before is None:
        return "regression" if after in BAD else "added"
    if before is after:
        return "unchanged"
    if (before is Outcome.PASS) or (after in BAD and before not in BAD):
        return "regression"
    if (after is Outcome.PASS) or (before in BAD and after not in BAD):
        return "improvement"
    return "changed"


def _index(doc: dict[str, Any]) -> dict[CaseKey, dict[str, Any]]:
    return {case_key(r): r for r in doc.get("results", [])}


def _notes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    notes = []
    def plugin(d: dict[str, Any]) -> str | None:
        p = (d.get("environment") or {}).get("plugin")
        return f"{p.get('distribution')} {p.get('version')}" if isinstance(p, dict) else None

    for label, get in (("level", lambda d: (d.get("run") or {}).get("level")),
                       ("seed", lambda d: (d.get("environment") or {}).get("seed")),
                       ("plugin", plugin), ("platform class", lambda d: (d.get("platform") or {}).get("class")),
                       ("vLLM release", lambda d: (d.get("environment") or {}).get("vllm"))):
        a, b = get(old), get(new)
        if a is not None and b is not None and a != b:
            notes.append(f"the files differ in {label}: {a} before, {b} now")
    for label, doc in (("the earlier", old), ("the later", new)):
        run = doc.get("run") or {}
        if run and not run.get("complete", True):
            notes.append(f"{label} file is incomplete ({run.get('written_results')} of "
                         f"{run.get('expected_results')} results): missing cases show as removed or added")
    return notes


def compare(old: dict[str, Any], new: dict[str, Any], old_label: str = "OLD", new_label: str = "NEW") -> Comparison:
    """What changed from `old` to `new`; NotComparable when they are runs of different platforms."""
    require_same_platform((old_label, platform_name(old)), (new_label, platform_name(new)))
    before, after = _index(old), _index(new)
    buckets: dict[str, list[Change]] = {k: [] for k in ("regression", "improvement", "changed", "added", "removed",
                                                        "upstream")}
    gate_upstream = bool((new.get("run") or {}).get("gate_upstream"))
    unchanged = 0
    for key in sorted(set(before) | set(after), key=lambda k: tuple("" if x is None else str(x) for x in k)):
        b = Outcome(before[key]["outcome"]) if key in before else None
        a = Outcome(after[key]["outcome"]) if key in after else None
        kind = _classify(b, a)
        if kind == "unchanged":
            unchanged += 1
            continue
        message = (after.get(key) or before.get(key) or {}).get("message")
        change = Change(key, b, a, message)
        origin = (after.get(key) or {}).get("origin")
        if kind == "regression" and not gate_upstream and isinstance(origin, dict) and origin.get("upstream") is True:
            kind = "upstream"
        buckets[kind].append(change)
        if kind in ("regression", "upstream") and b is None:
            buckets["added"].append(change)
    return Comparison(old_label, new_label, old.get("verdict"), new.get("verdict"), buckets["regression"],
                      buckets["improvement"], buckets["changed"], buckets["added"], buckets["removed"], unchanged,
                      _notes(old, new), buckets["upstream"], _release_change(old, new))


def _release_change(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """'vLLM A before, vLLM B now' when both files name a vLLM release and they differ."""
    a, b = ((d.get("environment") or {}).get("vllm") for d in (old, new))
    return release_change(a, b) if a and b else None


def render_text(c: Comparison) -> str:
    """The terminal summary: counts, then every regression (capped), then the other lists (capped)."""
    lines = [f"compare {c.old_label} -> {c.new_label}: verdict {c.old_verdict} -> {c.new_verdict}",
             f"{len(c.regressions)} regressions, {len(c.improvements)} improvements, {len(c.changed)} other changes, "
             f"{len(c.added)} added, {len(c.removed)} removed, {c.unchanged} unchanged"
             + (f"; {len(c.upstream_regressions)} upstream regressions ({UPSTREAM})" if c.upstream_regressions
                else ""), *c.notes]
    for title, changes in ((c.regressions_title(), c.regressions), (f"upstream regressions ({UPSTREAM})",
                                                            c.upstream_regressions),
                           ("improvements", c.improvements),
                           ("other changes", c.changed), ("added", c.added), ("removed", c.removed)):
        if changes:
            lines.append(f"{title}:")
            lines += [f"  {ch.line()}" for ch in changes[:MAX_LISTED]]
            if len(changes) > MAX_LISTED:
                lines.append(f"  ... and {len(changes) - MAX_LISTED} more")
    return "\n".join(lines)


def _md_code(text: str | None, limit: int = 200) -> str:
    """Text as an inline code span that cannot break out of it or of a table cell."""
    one = " ".join((text or "").split()).replace("`", "'").replace("|", "/")
    one = one if len(one) <= limit else one[: limit - 3] + "..."
    return f"`{one}`" if one else ""


def render_markdown(c: Comparison) -> str:
    """A pull-request comment: a headline, a counts table, the regressions with messages, the rest in details."""
    status = "regressions found" if c.regressions else "no regressions"
    out = [f"### Conformance: {status}", "",
           f"Verdict: **{c.old_verdict}** ({c.old_label}) -> **{c.new_verdict}** ({c.new_label})", ""]
    out += [f"> {note}" for note in c.notes] + ([""] if c.notes else [])
    out += ["| regressions | improvements | other changes | added | removed | unchanged |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |",
            f"| {len(c.regressions)} | {len(c.improvements)} | {len(c.changed)} | {len(c.added)} | "
            f"{len(c.removed)} | {c.unchanged} |", ""]
    if c.regressions:
        out += [f"#### {c.regressions_title()[0].upper()}{c.regressions_title()[1:]}", "", "| case | before | now | message |", "| --- | --- | --- | --- |"]
        for ch in c.regressions[:MAX_LISTED]:
            out.append(f"| {_md_code(describe(ch.key))} | {ch.before.value if ch.before else 'new'} | "
                       f"{ch.after.value} | {_md_code(ch.message)} |")
        if len(c.regressions) > MAX_LISTED:
            out.append(f"\n... and {len(c.regressions) - MAX_LISTED} more regressions")
        out.append("")
    if c.upstream_regressions:
        out += [f"{len(c.upstream_regressions)} upstream regressions ({UPSTREAM}), listed below.", ""]
    for title, changes in ((f"Upstream regressions ({UPSTREAM})", c.upstream_regressions),
                           ("Improvements", c.improvements), ("Other changes", c.changed),
                           ("Added", c.added), ("Removed", c.removed)):
        if changes:
            out += [f"<details><summary>{title} ({len(changes)})</summary>", ""]
            out += [f"- {_md_code(ch.line())}" for ch in changes[:MAX_LISTED]]
            if len(changes) > MAX_LISTED:
                out.append(f"- ... and {len(changes) - MAX_LISTED} more")
            out += ["", "</details>", ""]
    return "\n".join(out)
