"""`conformance merge`: join the results files of the shards of one run into the file of the whole run.

The merged file has the results, summary and verdict the unsharded run with the same seed would
have had (results ordered by nodeid; durations are the shards' own). Nothing is merged silently:
shards that are missing, given twice or overlapping, shards of different runs (platform,
environment, level, seed, selection), incomplete shards and files without shard information are
all reported as problems, and then no merged file is produced.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from conformance.results.result import (CONFORMANT, NOT_CONFORMANT, SCHEMA_VERSION, CheckResult, case_key, describe,
                                       summarize, verdict)

MAX_LISTED = 10


class MergeError(ValueError):
    """The shards cannot be merged; `problems` holds one line each."""

    def __init__(self, problems: list[str]):
        super().__init__(f"{len(problems)} problems: " + "; ".join(problems))
        self.problems = problems


def _shard_of(name: str, doc: dict[str, Any], problems: list[str]) -> tuple[int, int] | None:
    spec = ((doc.get("run") or {}).get("selection") or {}).get("shard")
    if not spec:
        problems.append(f"{name}: no run.selection.shard (was it written by a run with --conformance-shard=I/N?)")
        return None
    index, _, count = str(spec).partition("/")
    if not (index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        problems.append(f"{name}: run.selection.shard {spec!r} is not I/N")
        return None
    return int(index), int(count)


def _same(field: str, values: dict[str, Any], problems: list[str]) -> None:
    """A problem when the files disagree on `field` (named per distinct value)."""
    distinct: dict[str, list[str]] = defaultdict(list)
    for name, value in values.items():
        distinct[repr(value)].append(name)
    if len(distinct) > 1:
        parts = [f"{value} in {', '.join(names)}" for value, names in distinct.items()]
        problems.append(f"the shards are of different runs: {field} differs ({'; '.join(parts)})")


def merge_documents(docs: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Merge (name, document) pairs of the shards of one run; MergeError listing every problem."""
    problems: list[str] = []
    if not docs:
        raise MergeError(["no results files given"])
    by_index: dict[int, list[str]] = defaultdict(list)
    counts: dict[str, int] = {}
    for name, doc in docs:
        shard = _shard_of(name, doc, problems)
        if shard is not None:
            by_index[shard[0]].append(name)
            counts[name] = shard[1]
        run = doc.get("run") or {}
        if run and not run.get("complete"):
            problems.append(f"{name}: incomplete shard ({run.get('written_results')} of "
                            f"{run.get('expected_results')} results written): rerun it")
    _same("the shard count N", counts, problems)
    if counts and len(set(counts.values())) == 1:
        n = next(iter(counts.values()))
        missing = [f"{i}/{n}" for i in range(1, n + 1) if i not in by_index]
        if missing:
            problems.append(f"missing shards: {', '.join(missing)}")
    for index, names in sorted(by_index.items()):
        if len(names) > 1:
            problems.append(f"shard {index} given more than once: {', '.join(names)}")
    # shards of two vLLM releases first, by name: the environment line below would bury it in a dict
    _same("the vLLM release", {name: (doc.get("environment") or {}).get("vllm") for name, doc in docs}, problems)
    for field in ("platform", "environment"):
        _same(field, {name: doc.get(field) for name, doc in docs}, problems)
    for field in ("level", "seed", "gate_upstream"):
        _same(f"run.{field}", {name: (doc.get("run") or {}).get(field) for name, doc in docs}, problems)
    for field in ("keyword", "markexpr", "paths"):
        _same(f"run.selection.{field}",
              {name: ((doc.get("run") or {}).get("selection") or {}).get(field) for name, doc in docs}, problems)

    seen: dict[tuple, str] = {}
    overlaps: list[str] = []
    results: list[dict[str, Any]] = []
    for name, doc in docs:
        for r in doc.get("results", []):
            key = case_key(r)
            if key in seen:
                overlaps.append(f"{describe(key)} (in {seen[key]} and {name})")
                continue
            seen[key] = name
            results.append(r)
    if overlaps:
        more = f" and {len(overlaps) - MAX_LISTED} more" if len(overlaps) > MAX_LISTED else ""
        problems.append(f"{len(overlaps)} results appear in more than one shard: "
                        f"{'; '.join(overlaps[:MAX_LISTED])}{more}")
    if problems:
        raise MergeError(problems)
    return _document(docs, sorted(results, key=lambda r: (r.get("nodeid") or "", case_key(r))))


def _document(docs: Sequence[tuple[str, dict[str, Any]]], results: list[dict[str, Any]]) -> dict[str, Any]:
    first = docs[0][1]
    checks = [CheckResult.from_json(r) for r in results]
    # Each shard's verdict already applied its gate (strict or not on XPASS): the whole run is
    # CONFORMANT when every shard was, and no blocking outcome hides in the results.
    every_shard = all(doc.get("verdict") == CONFORMANT for _, doc in docs)
    gate_upstream = bool((first.get("run") or {}).get("gate_upstream"))   # the same in every shard
    merged_verdict = CONFORMANT if every_shard and verdict(checks, strict_xpass=False,
                                                           gate_upstream=gate_upstream) == CONFORMANT \
        else NOT_CONFORMANT
    doc = {"schema_version": first.get("schema_version", SCHEMA_VERSION), "platform": first.get("platform"),
           "environment": first.get("environment")}
    if all(d.get("run") for _, d in docs):
        run, selection = first["run"], first["run"].get("selection") or {}
        narrowed = bool(selection.get("keyword") or selection.get("markexpr") or selection.get("paths"))
        doc["run"] = {"level": run.get("level"), "seed": run.get("seed"),
                      "selection": {**selection, "partial": narrowed, "shard": None},
                      "expected_results": sum(d["run"].get("expected_results", 0) for _, d in docs),
                      "written_results": len(results),
                      "complete": all(d["run"].get("complete") for _, d in docs)}
        if "gate_upstream" in run:
            doc["run"]["gate_upstream"] = bool(run["gate_upstream"])
    doc.update({"results": results, "summary": summarize(checks), "verdict": merged_verdict})
    return doc
