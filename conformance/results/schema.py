"""The results-file schema (docs/results-file.md, schema_version 1, with the `run` block): `validate(doc)` lists problems.

Besides types it checks the file's own arithmetic: the summary counts the results, `written_results`
is the number of results, and a complete run wrote every result it expected.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from conformance.results.result import CONFORMANT, FAMILIES, NOT_CONFORMANT, SCHEMA_VERSION, Outcome, Selection

TOP_LEVEL_KEYS = ("schema_version", "platform", "environment", "run", "results", "summary", "verdict")
_NONE = type(None)
_RESULT_FIELDS = {
    "nodeid": (str, _NONE), "check": (str,), "op": (str, _NONE),
    "provider": (str, _NONE), "dtype": (str, _NONE), "case": (str, _NONE),
    "outcome": (str,), "message": (str, _NONE), "max_abs_err": (int, float, _NONE),
    "max_rel_err": (int, float, _NONE), "repro": (str, _NONE),
    "duration_s": (int, float, _NONE),
}
# files written before they existed lack them
_RESULT_OPTIONAL = {"err_to_tol": (int, float, _NONE), "origin": (dict, _NONE), "hint": (str, _NONE)}
_ORIGIN_FIELDS = {"distribution": (str, _NONE), "version": (str, _NONE), "code": (str, _NONE), "upstream": (bool,)}
_ENV_REQUIRED = {"python": (str,), "torch": (str,), "reference_impl": (str,), "seed": (int,)}
_ENV_OPTIONAL = {"triton": (str, _NONE), "device_name": (str, _NONE), "driver": (str, _NONE),
                 "plugin": (dict, _NONE), "vllm": (str,)}
_SELECTION_FIELDS = {"partial": (bool,), "keyword": (str, _NONE), "markexpr": (str, _NONE), "paths": (list,),
                     "shard": (str, _NONE)}
_RUN_FIELDS = {"level": (str,), "seed": (int,), "selection": (dict,), "expected_results": (int,),
               "written_results": (int,), "complete": (bool,)}


def _typed(value: Any, types: tuple) -> bool:
    """isinstance, except that a bool is not an int here (JSON true is not a count)."""
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types)


def _fields(obj: dict, fields: dict, where: str, optional: dict | None = None) -> list[str]:
    errors = []
    optional = optional or {}
    missing = sorted(set(fields) - set(obj))
    unknown = sorted(set(obj) - set(fields) - set(optional))
    if missing:
        errors.append(f"{where} lacks {missing}")
    if unknown:
        errors.append(f"{where} has unknown keys {unknown}")
    for key, types in {**fields, **optional}.items():
        if key in obj and not _typed(obj[key], types):
            errors.append(f"{where}.{key} has type {type(obj[key]).__name__}")
    return errors


def _environment(env: Any) -> list[str]:
    if not isinstance(env, dict):
        return [f"environment must be an object with {sorted(_ENV_REQUIRED)}, got {type(env).__name__}"]
    errors = _fields(env, _ENV_REQUIRED, "environment", _ENV_OPTIONAL)
    plugin = env.get("plugin")
    if isinstance(plugin, dict) and not (set(plugin) == {"distribution", "version"}
                                         and all(isinstance(v, str) for v in plugin.values())):
        errors.append("environment.plugin must be {distribution, version} strings or null")
    return errors


def _run(run: Any, results: list) -> list[str]:
    from conformance.collect.units import LEVELS

    if not isinstance(run, dict):
        return [f"run must be an object with {sorted(_RUN_FIELDS)}, got {type(run).__name__}"]
    errors = _fields(run, _RUN_FIELDS, "run", optional={"unmatched_waivers": (list,), "gate_upstream": (bool,)})
    if "level" in run and run["level"] not in LEVELS:
        errors.append(f"run.level {run['level']!r} is not one of {LEVELS}")
    selection = run.get("selection")
    if isinstance(selection, dict):
        errors += _fields(selection, _SELECTION_FIELDS, "run.selection")
        if isinstance(selection.get("paths"), list) and not all(isinstance(p, str) for p in selection["paths"]):
            errors.append("run.selection.paths must be a list of strings")
    written, expected = run.get("written_results"), run.get("expected_results")
    if _typed(written, (int,)) and written != len(results):
        errors.append(f"run.written_results is {written} but the file holds {len(results)} results")
    if _typed(written, (int,)) and _typed(expected, (int,)):
        if written > expected:
            errors.append(f"run.written_results {written} exceeds run.expected_results {expected}")
        if run.get("complete") is True and written != expected:
            errors.append(f"run.complete is true but {written} of {expected} expected results were written")
    return errors


def _results(results: list) -> list[str]:
    errors = []
    outcomes = {o.value for o in Outcome}
    for i, r in enumerate(results):
        where = f"results[{i}]"
        if not isinstance(r, dict):
            errors.append(f"{where} is not an object")
            continue
        missing, unknown = set(_RESULT_FIELDS) - set(r), set(r) - set(_RESULT_FIELDS) - set(_RESULT_OPTIONAL)
        if missing or unknown:
            errors.append(f"{where} keys {sorted(r)}: " + "; ".join(
                part for part in (f"missing {sorted(missing)}" if missing else "",
                                  f"unknown {sorted(unknown)}" if unknown else "") if part))
        for key, types in {**_RESULT_FIELDS, **_RESULT_OPTIONAL}.items():
            if key in r and (not isinstance(r[key], types) or isinstance(r[key], bool)):
                errors.append(f"{where}.{key} has type {type(r[key]).__name__}")
        if isinstance(r.get("origin"), dict):
            errors += _fields(r["origin"], _ORIGIN_FIELDS, f"{where}.origin")
        if r.get("check") not in FAMILIES:
            errors.append(f"{where}.check {r.get('check')!r} is not one of {FAMILIES}")
        if r.get("outcome") not in outcomes:
            errors.append(f"{where}.outcome {r.get('outcome')!r} is not an outcome")
        elif r["outcome"] != "PASS" and not r.get("message"):
            errors.append(f"{where} ({r['outcome']}) has no message")
    return errors


def validate(doc: Any) -> list[str]:
    """Problems with `doc` against the results-file schema; empty when it conforms."""
    if not isinstance(doc, dict):
        return ["document is not a JSON object"]
    errors: list[str] = []
    if set(doc) != set(TOP_LEVEL_KEYS):
        missing, unknown = sorted(set(TOP_LEVEL_KEYS) - set(doc)), sorted(set(doc) - set(TOP_LEVEL_KEYS))
        errors.append("top-level keys: " + "; ".join(filter(None, [f"missing {missing}" if missing else "",
                                                                   f"unknown {unknown}" if unknown else ""])))
    if doc.get("schema_version") != SCHEMA_VERSION:
        errors.append(f"schema_version {doc.get('schema_version')!r} != {SCHEMA_VERSION}")
    plat = doc.get("platform")
    if not (isinstance(plat, dict) and set(plat) == {"name", "class", "device_type"}
            and all(isinstance(v, str) for v in plat.values())):
        errors.append(f"platform must be {{name, class, device_type}} strings, got {plat!r}")
    errors += _environment(doc.get("environment"))
    results = doc.get("results")
    if not isinstance(results, list):
        errors.append("results is not a list")
        results = []
    if "run" in doc:
        errors += _run(doc["run"], results)
    errors += _results(results)
    outcomes = {o.value for o in Outcome}
    summary = doc.get("summary")
    if not (isinstance(summary, dict) and all(k in outcomes and isinstance(v, int) for k, v in summary.items())):
        errors.append(f"summary must map outcomes to counts, got {summary!r}")
    else:
        actual = Counter(r.get("outcome") for r in results if isinstance(r, dict))
        if {k: v for k, v in summary.items() if v} != {k: v for k, v in actual.items() if v}:
            errors.append(f"summary {summary} does not count the results {dict(actual)}")
    if doc.get("verdict") not in (CONFORMANT, NOT_CONFORMANT):
        errors.append(f"verdict {doc.get('verdict')!r} is not CONFORMANT or NOT_CONFORMANT")
    elif doc["verdict"] == CONFORMANT and isinstance(doc.get("run"), dict) and doc["run"].get("complete") is False:
        errors.append("verdict is CONFORMANT but run.complete is false (an incomplete run is NOT_CONFORMANT)")
    return errors


def run_status(doc: dict) -> tuple[bool, bool, str]:
    """(complete, partial, one line) of a parsed results file, for the report and `validate`."""
    run = doc.get("run")
    if not isinstance(run, dict):
        return False, False, "INCOMPLETE: the file has no run block, so nothing says what it covers"
    sel = run.get("selection") or {}
    partial = bool(sel.get("partial"))
    complete = run.get("complete") is True
    parts = []
    if not complete:
        parts.append(f"INCOMPLETE: {run.get('written_results')} of {run.get('expected_results')} expected results "
                     "written; the run did not finish")
    if partial:
        what = Selection(**{k: sel.get(k) for k in ("partial", "keyword", "markexpr", "shard")},
                         paths=list(sel.get("paths") or [])).describe()
        parts.append(f"PARTIAL SELECTION ({what}): the verdict covers the selected checks only")
    return complete, partial, "; ".join(parts) or (f"complete run, level {run.get('level')}, "
                                                   f"{run.get('written_results')} results")
