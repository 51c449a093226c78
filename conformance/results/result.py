"""Outcomes, one check's result, the verdict, and the results file (docs/results-file.md, schema_version 1).

The results file is rewritten atomically (write to a temporary file, then rename) so a run that
is killed leaves a valid document with what it had; its `run` block says what the run covers
(level, seed, selection, results expected and written, complete). Until the run has completed
its verdict reads `NOT_CONFORMANT`, so a CI gate never passes on an incomplete file. `case_key` is
the identity of a result across files, what merge and compare match results by.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

SCHEMA_VERSION = 1
FAMILIES = ("numerics", "aliasing", "compile", "dispatch", "model", "attention", "engine", "collective", "sampling")


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


FILE_FIELD = {"family": "check"}   # CheckResult attribute -> results-file member, where the names differ


@dataclasses.dataclass
class CheckResult:
    """One entry of `results` in the results file (fields in the order of docs/results-file.md).

    `family` is the check family (one of FAMILIES), which the file names `check` (public, normative field name):
    `to_json` writes it as "check", in the same place, and `from_json` reads "check" into it. Not to be confused
    with `Unit.check`, the name of one check of the family (`ir_case`).
    """

    nodeid: str | None
    family: str
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
    err_to_tol: float | None = None   # conformance.judge.tolerances; optional when reading
    origin: dict[str, Any] | None = None   # whose code ran (conformance.collect.origin); optional when reading
    hint: str | None = None           # the cause hint of its provider and op (conformance.judge.hints); optional

    def __post_init__(self):
        self.outcome = Outcome(self.outcome)
        if self.family not in FAMILIES:
            raise ValueError(f"family {self.family!r} (the results file's 'check') is not one of {FAMILIES}")

    def to_json(self) -> dict[str, Any]:
        """The results-file entry: the attribute `family` under its file name `check`, fields in file order."""
        data = {FILE_FIELD.get(f.name, f.name): getattr(self, f.name) for f in dataclasses.fields(self)}
        data["outcome"] = self.outcome.value
        for key in ("max_abs_err", "max_rel_err", "err_to_tol"):
            value = data[key]
            if value is not None and not (value == value and abs(value) != float("inf")):
                data[key] = None if value != value else (1e308 if value > 0 else -1e308)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckResult:
        """A results-file entry (its `check` read into `family`); members this version does not know are ignored."""
        names = {FILE_FIELD.get(f.name, f.name): f.name for f in dataclasses.fields(cls)}
        return cls(**{names[k]: v for k, v in data.items() if k in names})


LAYER_TESTS = ("test_layer_case", "test_layer_coverage", "test_oot_registration", "test_oot_dispatch",
               "test_layer_compile")


def is_layer_result(r: CheckResult) -> bool:
    """Whether a result is about a CustomOp layer (its `op` is then the registered layer name)."""
    return suite_function(r.nodeid) in LAYER_TESTS


def is_upstream(result: CheckResult) -> bool:
    """Whether the result graded upstream code, not the distribution under test (its `origin` says so)."""
    return isinstance(result.origin, dict) and result.origin.get("upstream") is True


def gated(result: CheckResult, gate_upstream: bool = False) -> bool:
    """Whether the result counts towards the verdict: the code under test always, upstream code when asked."""
    return gate_upstream or not is_upstream(result)


def verdict(results: Iterable[CheckResult], *, strict_xpass: bool = True, gate_upstream: bool = False) -> str:
    """CONFORMANT unless some gated result is FAIL, ERROR, CRASH, TIMEOUT (or XPASS with the strict gate).
    Results of upstream code (`origin.upstream`) are gated only with `gate_upstream`."""
    for r in results:
        if not gated(r, gate_upstream):
            continue
        if r.outcome in BLOCKING or (strict_xpass and r.outcome is Outcome.XPASS):
            return NOT_CONFORMANT
    return CONFORMANT


def summarize(results: Iterable[CheckResult]) -> dict[str, int]:
    """Outcome name -> count, in severity order, outcomes that occurred only."""
    counts = Counter(r.outcome for r in results)
    return {o.value: counts[o] for o in Outcome if counts[o]}


@dataclasses.dataclass
class Selection:
    """What narrowed the run: `partial` is true when -k, -m, explicit paths, deselection or a shard did."""

    partial: bool = False
    keyword: str | None = None
    markexpr: str | None = None
    paths: list[str] = dataclasses.field(default_factory=list)
    shard: str | None = None

    def describe(self) -> str:
        """'-k EXPR, -m EXPR, paths a b, shard 1/4' (what narrowed the run), or '' when nothing did."""
        parts = [f"-k {self.keyword!r}" if self.keyword else "", f"-m {self.markexpr!r}" if self.markexpr else "",
                 ("paths " + " ".join(self.paths)) if self.paths else "", f"shard {self.shard}" if self.shard else ""]
        return ", ".join(p for p in parts if p) or ("deselected checks" if self.partial else "")


@dataclasses.dataclass
class RunInfo:
    """The results file's `run` object: level, seed, selection and how many results the run collected."""

    level: str
    seed: int
    selection: Selection = dataclasses.field(default_factory=Selection)
    expected_results: int = 0
    unmatched_waivers: list[str] = dataclasses.field(default_factory=list)   # set when the run ends
    gate_upstream: bool = False   # --conformance-gate-upstream: upstream code's failures count too

    def to_json(self, written: int, complete: bool) -> dict[str, Any]:
        return {"level": self.level, "seed": self.seed, "selection": dataclasses.asdict(self.selection),
                "expected_results": self.expected_results, "written_results": written, "complete": complete,
                "unmatched_waivers": list(self.unmatched_waivers), "gate_upstream": self.gate_upstream}


class ResultsFile:
    """Keeps the document and rewrites it atomically; `add` throttles, `write(final=True)` ends the run.

    `complete` is true only in the final write of a run that finished with every expected result. Each result is
    encoded once, when it is added, as one line of the `results` array: a rewrite joins those lines instead of
    encoding thousands of results again every half second (in the xdist controller that stole a core's time from
    the workers).
    """

    def __init__(self, path: str, platform_info: dict[str, Any], env: dict[str, Any],
                 min_interval_s: float = 0.5, run: RunInfo | None = None):
        self.path = os.path.abspath(path)
        self.platform_info = platform_info
        self.env = env
        self.run = run if run is not None else RunInfo(level="standard", seed=int(env.get("seed", 0)))
        self.results: list[CheckResult] = []
        self._lines: list[str] = []     # results[i] encoded
        self.min_interval_s = min_interval_s
        self._last_write = 0.0
        self.write(final=False)

    def add(self, result: CheckResult) -> None:
        self._lines.append(json.dumps(result.to_json(), allow_nan=False))
        self.results.append(result)
        if time.monotonic() - self._last_write >= self.min_interval_s:
            self.write(final=False)

    def reencode(self) -> None:
        """Encode every result again (after the run's end added each failure's cause hint)."""
        self._lines = [json.dumps(r.to_json(), allow_nan=False) for r in self.results]

    def complete(self, final: bool, finished: bool = True) -> bool:
        return final and finished and len(self.results) == self.run.expected_results

    def text(self, final: bool, strict_xpass: bool = True, finished: bool = True) -> str:
        """The document as written: one result per line, the other members indented."""
        complete = self.complete(final, finished)
        head = {"schema_version": SCHEMA_VERSION, "platform": self.platform_info, "environment": self.env,
                "run": self.run.to_json(len(self.results), complete)}
        tail = {"summary": summarize(self.results),
                "verdict": (verdict(self.results, strict_xpass=strict_xpass, gate_upstream=self.run.gate_upstream)
                            if complete else NOT_CONFORMANT)}
        results = "[\n  " + ",\n  ".join(self._lines) + "\n ]" if self._lines else "[]"
        return (json.dumps(head, indent=1, allow_nan=False)[:-2] + f',\n "results": {results},\n'
                + json.dumps(tail, indent=1, allow_nan=False)[2:])

    def write(self, final: bool, strict_xpass: bool = True, finished: bool = True) -> None:
        """Rewrite the file; `finished` is false when the session ended early (interrupt, -x, crash)."""
        write_text_atomically(self.path, self.text(final, strict_xpass, finished))
        self._last_write = time.monotonic()


def write_json_atomically(path: str, doc: dict[str, Any]) -> None:
    """Write `doc` to a temporary file beside `path`, then rename: a reader never sees half a document."""
    write_text_atomically(path, json.dumps(doc, indent=1, allow_nan=False))


def write_text_atomically(path: str, text: str) -> None:
    """`text` to a temporary file beside `path`, then renamed over it."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".conformance-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)   # mkstemp makes it private; a results file is for CI to read
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)         # no stray temporary file beside a path that cannot be written
        raise


class ResultsFileError(ValueError):
    """A results file cannot be read; the message is one line naming the file and the problem."""


def load_results(path: str) -> dict[str, Any]:
    """The parsed document; ResultsFileError (one line) when the file is missing, unreadable or not JSON."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise ResultsFileError(f"{path}: no such results file") from None
    except OSError as exc:
        raise ResultsFileError(f"{path}: cannot read it ({type(exc).__name__}: {exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8-sig")   # a byte-order mark, as some editors write, is no problem
    except UnicodeDecodeError as exc:
        raise ResultsFileError(f"{path}: not a results file: not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                               f"offset {exc.start}); a results file is JSON written by --conformance-json") from None
    if not text.strip():
        raise ResultsFileError(f"{path}: the file is empty, not a results file") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        at_end = exc.pos >= len(text.rstrip()) - 1 or exc.msg.startswith("Unterminated")
        cut = "; the file looks truncated" if at_end else ""
        raise ResultsFileError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
                               f"{cut}") from None
    if not isinstance(doc, dict):
        raise ResultsFileError(f"{path}: a results file is a JSON object, this is a {type(doc).__name__}")
    return doc


# ----- the identity of one result across files -------------------------------------------------------
# (check, test, op, provider, dtype, case): the suite test's name is part of it because two dispatch
# checks can share the other fields (priority and supports_args of one provider; coverage of an IR op
# and of the CustomOp of the same name). The nodeid's path is not: it depends on where pytest ran.
CaseKey = tuple


def suite_function(nodeid: str | None) -> str:
    """'suites/test_dispatch.py::test_priority[rms_norm-cpp]' -> 'test_priority'."""
    return (nodeid or "").rpartition("::")[2].partition("[")[0]


def case_key(result: dict[str, Any]) -> CaseKey:
    """The key merge and compare match a results-file entry by."""
    return (result.get("check"), suite_function(result.get("nodeid")), result.get("op"), result.get("provider"),
            result.get("dtype"), result.get("case"))


def describe(key: CaseKey) -> str:
    """'numerics.test_ir_case rms_norm cpp float32 tokens=7,hidden=769' (absent fields left out)."""
    check, test, *rest = key
    head = f"{check}.{test}" if test else str(check)
    return " ".join([head, *(str(x) for x in rest if x is not None)])


def require_results_shape(path: str, doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` when it has what merge and compare read (a `results` list of objects with a `check` and a valid
    `outcome`; `run` and its `selection`, where present, objects); else ResultsFileError, one line naming the
    file and the first problem (`conformance validate` lists them all). Older files without a run block pass."""
    outcomes = {o.value for o in Outcome}
    problem = None
    results = doc.get("results")
    run = doc.get("run", {})
    if not isinstance(results, list):
        problem = "its 'results' is not a list"
    elif not isinstance(run, dict) or not isinstance(run.get("selection", {}), dict):
        problem = "its 'run' block is not an object with a 'selection' object"
    else:
        bad = next((i for i, r in enumerate(results) if not isinstance(r, dict) or not isinstance(r.get("check"), str)
                    or r.get("outcome") not in outcomes), None)
        if bad is not None:
            problem = f"results[{bad}] is not a result (an object with 'check' and a valid 'outcome')"
    if problem:
        raise ResultsFileError(f"{path}: not a results file: {problem} (conformance validate lists every problem)")
    return doc
