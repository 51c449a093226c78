"""Expected-failures manifest (`--conformance-waivers`) and the baseline gate (`--conformance-baseline`).

A waiver matches results by `check`, `op`, `provider`, `dtype`, `case` (each optional, shell-style
patterns) and must give a `reason`. TOML: `[[waiver]]` tables; JSON: a list, or {"waivers": [...]}.
A covered failure becomes XFAIL; a covered PASS becomes XPASS (the waiver is stale).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json

from conformance.results.result import BLOCKING, CheckResult, Outcome

MATCH_FIELDS = ("check", "op", "provider", "dtype", "case")


class WaiverFileError(ValueError):
    """The manifest cannot be read; the message names the file and the entry."""


@dataclasses.dataclass
class Waiver:
    reason: str
    check: str | None = None
    op: str | None = None
    provider: str | None = None
    dtype: str | None = None
    case: str | None = None
    used: int = 0

    def matches(self, result: CheckResult) -> bool:
        for field in MATCH_FIELDS:
            pattern = getattr(self, field)
            if pattern is not None and not fnmatch.fnmatchcase(str(getattr(result, field)), pattern):
                return False
        return True

    def describe(self) -> str:
        parts = [f"{f}={getattr(self, f)}" for f in MATCH_FIELDS if getattr(self, f) is not None]
        return ", ".join(parts) or "(matches everything)"


def _entries(path: str, data, key: str, form: str) -> list:
    """The waiver entries of a parsed manifest; WaiverFileError naming the file when its shape is wrong."""
    if data == {}:
        return []   # an empty manifest (comments only): no waivers, and the header says 0
    if isinstance(data, dict):
        unknown = sorted(set(data) - {key})
        if unknown or key not in data:
            raise WaiverFileError(f"waivers file {path}: expected {form}, found top-level keys {sorted(data)}"
                                  + (f" ({unknown} unknown)" if unknown else ""))
        data = data[key]
    if not isinstance(data, list):
        raise WaiverFileError(f"waivers file {path}: expected {form}, found a {type(data).__name__}")
    return data


def load_waivers(path: str) -> list[Waiver]:
    """The manifest's waivers; WaiverFileError (one line naming the file) when it cannot serve as one."""
    try:
        if path.endswith(".toml"):
            import tomllib

            with open(path, "rb") as fh:
                entries = _entries(path, tomllib.load(fh), "waiver", "[[waiver]] tables")
        else:
            with open(path) as fh:
                data = json.load(fh)
            entries = _entries(path, data, "waivers", 'a list of waivers or {"waivers": [...]}')
    except WaiverFileError:
        raise
    except (OSError, ValueError) as exc:
        raise WaiverFileError(f"cannot read waivers file {path}: {' '.join(str(exc).split())}") from None
    waivers = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise WaiverFileError(f"{path}: waiver {i} is not a table/object")
        unknown = set(entry) - set(MATCH_FIELDS) - {"reason"}
        if unknown:
            raise WaiverFileError(f"{path}: waiver {i} has unknown keys {sorted(unknown)}")
        if not entry.get("reason"):
            raise WaiverFileError(f"{path}: waiver {i} ({entry}) needs a reason")
        waivers.append(Waiver(**{k: str(v) for k, v in entry.items()}))
    return waivers


def apply_waivers(result: CheckResult, waivers: list[Waiver]) -> CheckResult:
    """XFAIL for a covered failure, XPASS for a covered pass; other outcomes are left alone."""
    for waiver in waivers:
        if not waiver.matches(result):
            continue
        waiver.used += 1
        if result.outcome in BLOCKING:
            return dataclasses.replace(result, outcome=Outcome.XFAIL,
                                       message=f"waived ({waiver.reason}); was {result.outcome.value}: {result.message}")
        if result.outcome is Outcome.PASS:
            return dataclasses.replace(result, outcome=Outcome.XPASS,
                                       message=f"passed, yet waived ({waiver.reason}): the waiver "
                                               f"[{waiver.describe()}] is stale; remove it")
        return result
    return result


def result_key(r) -> tuple:
    get = r.get if isinstance(r, dict) else (lambda k: getattr(r, k))
    return tuple(get(k) for k in MATCH_FIELDS)


def load_baseline(path: str) -> dict[tuple, str]:
    """Result key -> outcome of an earlier results file; WaiverFileError (one line naming the file and the
    problem) when it is unreadable or not shaped like a results file, so the gate is never off silently."""
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        raise WaiverFileError(f"cannot read baseline {path}: {' '.join(str(exc).split())}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        found = f"top-level keys {sorted(doc)}" if isinstance(doc, dict) else f"a {type(doc).__name__}"
        raise WaiverFileError(f"baseline {path} is not a results file: expected an object with a 'results' list, "
                              f"found {found}")
    outcomes = {o.value for o in Outcome}
    baseline = {}
    for i, r in enumerate(doc["results"]):
        if not isinstance(r, dict) or not isinstance(r.get("check"), str) or r.get("outcome") not in outcomes:
            raise WaiverFileError(f"baseline {path}: results[{i}] is not a result (needs 'check' and a valid "
                                  f"'outcome')")
        baseline[result_key(r)] = r["outcome"]
    return baseline


def regression(result: CheckResult, baseline: dict[tuple, str]) -> str | None:
    """A message when the baseline had PASS here and this run has anything else."""
    before = baseline.get(result_key(result))
    if before == Outcome.PASS.value and result.outcome is not Outcome.PASS:
        return f"regression against the baseline: PASS before, {result.outcome.value} now"
    return None
