"""Outcomes, one check's result, the verdict, and the results file (docs/results-file.md, schema_version 1).

The results file is rewritten atomically (write to a temporary file, then rename) so a run that
is killed leaves a valid document with what it had; until the run ends its verdict reads
`NOT_CONFORMANT`, so a CI gate never passes on a partial file.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import platform as _pyplatform
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

SCHEMA_VERSION = 1
FAMILIES = ("numerics", "aliasing", "compile", "dispatch", "model")


class Outcome(str, enum.Enum):
    """docs/checks.md outcomes, declared from least to most severe."""

    PASS = "PASS"
    NOT_IMPLEMENTED = "NOT_IMPLEMENTED"
    NOT_SUPPORTED = "NOT_SUPPORTED"
    SKIP = "SKIP"
    XFAIL = "XFAIL"
    QUALITY_WARNING = "QUALITY_WARNING"
    XPASS = "XPASS"
    FAIL = "FAIL"
    ERROR = "ERROR"
    TIMEOUT = "TIMEOUT"
    CRASH = "CRASH"

    @property
    def severity(self) -> int:
        return list(Outcome).index(self)

    @property
    def blocks_conformance(self) -> bool:
        return self in BLOCKING


BLOCKING = frozenset({Outcome.FAIL, Outcome.ERROR, Outcome.CRASH, Outcome.TIMEOUT})
CONFORMANT = "CONFORMANT"
NOT_CONFORMANT = "NOT_CONFORMANT"


@dataclasses.dataclass
class CheckResult:
    """One entry of `results` in the results file (field names and order as in docs/results-file.md)."""

    nodeid: str | None
    check: str
    op: str | None
    provider: str | None
    dtype: str | None
    case: str | None
    outcome: Outcome
    message: str | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    repro: str | None = None
    duration_s: float | None = None

    def __post_init__(self):
        self.outcome = Outcome(self.outcome)
        if self.check not in FAMILIES:
            raise ValueError(f"check {self.check!r} is not one of {FAMILIES}")

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["outcome"] = self.outcome.value
        for key in ("max_abs_err", "max_rel_err"):
            value = data[key]
            if value is not None and not (value == value and abs(value) != float("inf")):
                data[key] = None if value != value else (1e308 if value > 0 else -1e308)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckResult:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def verdict(results: Iterable[CheckResult], *, strict_xpass: bool = True) -> str:
    """CONFORMANT unless some result is FAIL, ERROR, CRASH, TIMEOUT (or XPASS with the strict gate)."""
    for r in results:
        if r.outcome in BLOCKING or (strict_xpass and r.outcome is Outcome.XPASS):
            return NOT_CONFORMANT
    return CONFORMANT


def summarize(results: Iterable[CheckResult]) -> dict[str, int]:
    """Outcome name -> count, in severity order, outcomes that occurred only."""
    counts = Counter(r.outcome for r in results)
    return {o.value: counts[o] for o in Outcome if counts[o]}


def environment(seed: int) -> dict[str, Any]:
    import torch

    import reference_impl

    return {"python": _pyplatform.python_version(), "torch": torch.__version__.split("+")[0],
            "reference_impl": reference_impl.__version__, "seed": seed}


class ResultsFile:
    """Keeps the document and rewrites it atomically; `flush` throttles, `finish` writes the verdict."""

    def __init__(self, path: str, platform_info: dict[str, Any], env: dict[str, Any],
                 min_interval_s: float = 0.5):
        self.path = os.path.abspath(path)
        self.platform_info = platform_info
        self.env = env
        self.results: list[CheckResult] = []
        self.min_interval_s = min_interval_s
        self._last_write = 0.0
        self.write(final=False)

    def add(self, result: CheckResult) -> None:
        self.results.append(result)
        if time.monotonic() - self._last_write >= self.min_interval_s:
            self.write(final=False)

    def document(self, final: bool, strict_xpass: bool = True) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "platform": self.platform_info,
            "environment": self.env,
            "results": [r.to_json() for r in self.results],
            "summary": summarize(self.results),
            "verdict": verdict(self.results, strict_xpass=strict_xpass) if final else NOT_CONFORMANT,
        }

    def write(self, final: bool, strict_xpass: bool = True) -> None:
        doc = self.document(final, strict_xpass)
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".conformance-", suffix=".json", dir=directory)
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1, allow_nan=False)
        os.chmod(tmp, 0o644)   # mkstemp makes it private; a results file is for CI to read
        os.replace(tmp, self.path)
        self._last_write = time.monotonic()


def load_results(path: str) -> dict[str, Any]:
    with open(path) as fh:
        return json.load(fh)


# ----- schema --------------------------------------------------------------------------------------
_RESULT_FIELDS = {
    "nodeid": (str, type(None)), "check": (str,), "op": (str, type(None)),
    "provider": (str, type(None)), "dtype": (str, type(None)), "case": (str, type(None)),
    "outcome": (str,), "message": (str, type(None)), "max_abs_err": (int, float, type(None)),
    "max_rel_err": (int, float, type(None)), "repro": (str, type(None)),
    "duration_s": (int, float, type(None)),
}


def validate_document(doc: Any) -> list[str]:
    """Problems with `doc` against the schema of docs/results-file.md; empty when it conforms."""
    errors: list[str] = []
    if not isinstance(doc, dict):
        return ["document is not a JSON object"]
    expected_keys = {"schema_version", "platform", "environment", "results", "summary", "verdict"}
    if set(doc) != expected_keys:
        errors.append(f"top-level keys {sorted(doc)} != {sorted(expected_keys)}")
    if doc.get("schema_version") != SCHEMA_VERSION:
        errors.append(f"schema_version {doc.get('schema_version')!r} != {SCHEMA_VERSION}")
    plat = doc.get("platform")
    if not (isinstance(plat, dict) and set(plat) == {"name", "class", "device_type"}
            and all(isinstance(v, str) for v in plat.values())):
        errors.append(f"platform must be {{name, class, device_type}} strings, got {plat!r}")
    env = doc.get("environment")
    if not (isinstance(env, dict) and set(env) == {"python", "torch", "reference_impl", "seed"}
            and isinstance(env.get("seed"), int)
            and all(isinstance(env.get(k), str) for k in ("python", "torch", "reference_impl"))):
        errors.append(f"environment must be {{python, torch, reference_impl, seed:int}}, got {env!r}")
    results = doc.get("results")
    if not isinstance(results, list):
        errors.append("results is not a list")
        results = []
    outcomes = {o.value for o in Outcome}
    for i, r in enumerate(results):
        where = f"results[{i}]"
        if not isinstance(r, dict):
            errors.append(f"{where} is not an object")
            continue
        if set(r) != set(_RESULT_FIELDS):
            errors.append(f"{where} keys {sorted(r)} != {sorted(_RESULT_FIELDS)}")
        for key, types in _RESULT_FIELDS.items():
            if key in r and (not isinstance(r[key], types) or isinstance(r[key], bool)):
                errors.append(f"{where}.{key} has type {type(r[key]).__name__}")
        if r.get("check") not in FAMILIES:
            errors.append(f"{where}.check {r.get('check')!r} is not one of {FAMILIES}")
        if r.get("outcome") not in outcomes:
            errors.append(f"{where}.outcome {r.get('outcome')!r} is not an outcome")
        elif r["outcome"] != "PASS" and not r.get("message"):
            errors.append(f"{where} ({r['outcome']}) has no message")
    summary = doc.get("summary")
    if not (isinstance(summary, dict) and all(k in outcomes and isinstance(v, int) for k, v in summary.items())):
        errors.append(f"summary must map outcomes to counts, got {summary!r}")
    elif isinstance(results, list):
        actual = Counter(r.get("outcome") for r in results if isinstance(r, dict))
        if {k: v for k, v in summary.items() if v} != {k: v for k, v in actual.items() if v}:
            errors.append(f"summary {summary} does not count the results {dict(actual)}")
    if doc.get("verdict") not in (CONFORMANT, NOT_CONFORMANT):
        errors.append(f"verdict {doc.get('verdict')!r} is not CONFORMANT or NOT_CONFORMANT")
    return errors
