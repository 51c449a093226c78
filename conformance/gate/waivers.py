"""Expected-failures manifest (`--conformance-waivers`) and the baseline gate (`--conformance-baseline`).

A waiver matches results by `check`, `op`, `provider`, `dtype`, `case` (each optional, shell-style
patterns) and must give a `reason`. `check` names checks as repro lines do (`numerics.ir_case`) or
by family (`numerics`). TOML: `[[waiver]]` tables; JSON: a list, or {"waivers": [...]}.
A waiver is for failures: a covered FAIL, ERROR, TIMEOUT or CRASH becomes XFAIL. A PASS stays PASS,
except under a waiver that names that one case exactly (`names_exactly`), which is stale once it
passes: XPASS. A broader waiver (a pattern, a family, a field left out) that covers no failure by
the end of the run is reported as stale, without failing the run (docs/waivers-and-baselines.md).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import re

from conformance.results.result import BLOCKING, FAMILIES, FILE_FIELD, CheckResult, Outcome, suite_function

MATCH_FIELDS = ("check", "op", "provider", "dtype", "case")
FILE_FIELD_OF = {member: attr for attr, member in FILE_FIELD.items()}   # "check" -> CheckResult.family
PATTERN_CHARS = frozenset("*?[")


class WaiverFileError(ValueError):
    """The manifest cannot be read; the message names the file and the entry."""


_REPRO_CHECK = re.compile(r"--check (\w+\.\w+)")


def check_name(result: CheckResult) -> str:
    """'numerics.ir_case': the check as the result's repro line names it (else from the suite function)."""
    named = _REPRO_CHECK.search(result.repro or "")
    if named:
        return named.group(1)
    test = suite_function(result.nodeid).removeprefix("test_")
    return f"{result.family}.{test}" if test else result.family


def is_pattern(value: str) -> bool:
    return any(c in PATTERN_CHARS for c in value)


@dataclasses.dataclass
class Waiver:
    reason: str
    check: str | None = None
    op: str | None = None
    provider: str | None = None
    dtype: str | None = None
    case: str | None = None

    def matches(self, result: CheckResult) -> bool:
        if self.check is not None and not (fnmatch.fnmatchcase(result.family, self.check)
                                           or fnmatch.fnmatchcase(check_name(result), self.check)):
            return False
        for field in MATCH_FIELDS[1:]:
            pattern = getattr(self, field)
            if pattern is not None and not fnmatch.fnmatchcase(str(getattr(result, field)), pattern):
                return False
        return True

    def names_exactly(self, result: CheckResult) -> bool:
        """Whether this waiver names exactly this one result: `check` is its FAMILY.CHECK and every other field
        the result has (op, provider, dtype, case where not null) is given literally, without a pattern."""
        if self.check != check_name(result):
            return False
        for field in MATCH_FIELDS[1:]:
            value = getattr(result, field)
            if value is not None and getattr(self, field) != value:
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


def _check_names() -> list[str]:
    from conformance.checks import records

    return sorted(records())


def _check_problem(value: str) -> str | None:
    """Why a waiver's `check` can match nothing, or None: a literal must be a family or a FAMILY.CHECK."""
    if is_pattern(value) or value in FAMILIES:
        return None
    names = _check_names()
    if value in names:
        return None
    return (f"check {value!r} names no check: give a family ({', '.join(FAMILIES)}) or FAMILY.CHECK as repro lines "
            f"print it ({', '.join(names)}), or a pattern")


def load_waivers(path: str) -> list[Waiver]:
    """The manifest's waivers; WaiverFileError (one line naming the file) when it cannot serve as one."""
    try:
        if path.endswith(".toml"):
            import tomllib

            with open(path, "rb") as fh:
                entries = _entries(path, tomllib.load(fh), "waiver", "[[waiver]] tables")
        else:
            with open(path, encoding="utf-8") as fh:
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
        not_text = sorted(k for k, v in entry.items() if not isinstance(v, str))
        if not_text:
            raise WaiverFileError(f"{path}: waiver {i}: {', '.join(not_text)} must be text (a name or a pattern)")
        problem = _check_problem(entry["check"]) if "check" in entry else None
        if problem:
            raise WaiverFileError(f"{path}: waiver {i}: {problem}")
        waivers.append(Waiver(**entry))
    return waivers


def apply_waivers(result: CheckResult, waivers: list[Waiver]) -> CheckResult:
    """XFAIL for a covered failure (the first covering waiver's reason); XPASS for a PASS that a waiver names
    exactly; every other result, a PASS under a broader waiver included, is left alone."""
    if result.outcome in BLOCKING:
        for waiver in waivers:
            if waiver.matches(result):
                return dataclasses.replace(result, outcome=Outcome.XFAIL, message=f"waived ({waiver.reason}); "
                                           f"was {result.outcome.value}: {result.message}")
    elif result.outcome is Outcome.PASS:
        for waiver in waivers:
            if waiver.matches(result) and waiver.names_exactly(result):
                return dataclasses.replace(result, outcome=Outcome.XPASS,
                                           message=f"passed, yet waived ({waiver.reason}): the waiver "
                                                   f"[{waiver.describe()}] is stale; remove it")
    return result


def stale_waivers(waivers: list[Waiver], results: list[CheckResult]) -> list[tuple[Waiver, str]]:
    """(waiver, why) for each waiver that waived nothing in a run with these (already waived) results: it matched
    no result, or every result it covers passed (a broad waiver; one naming a case exactly made it XPASS)."""
    stale = []
    for waiver in waivers:
        covered = [r for r in results if waiver.matches(r)]
        if any(r.outcome is Outcome.XFAIL or (r.outcome is Outcome.XPASS and waiver.names_exactly(r))
               for r in covered):
            continue
        stale.append((waiver, "matched no result of this run" if not covered else
                      f"covers {len(covered)} results of this run, none of them failing: it is stale"))
    return stale


def result_key(r) -> tuple:
    """(check, op, provider, dtype, case) of a results-file entry (a dict) or of a CheckResult (whose `family` is the
    file's `check`)."""
    get = r.get if isinstance(r, dict) else (lambda k: getattr(r, FILE_FIELD_OF.get(k, k)))
    return tuple(get(k) for k in MATCH_FIELDS)


class Baseline(dict):
    """Result key -> outcome of an earlier results file, and the vLLM release that file was made on (`vllm`, None
    for a run without vLLM), so that a change of release is never read as a regression of the vendor's code."""

    def __init__(self, outcomes: dict[tuple, str], vllm: str | None = None):
        super().__init__(outcomes)
        self.vllm = vllm


def load_baseline(path: str, platform: str | None = None) -> Baseline:
    """The baseline of an earlier results file; WaiverFileError (one line naming the file and the problem) when it
    is unreadable, not shaped like a results file, or a run of another platform than `platform` (its results would
    match nothing here), so the gate is never off silently."""
    from conformance.gate.comparable import NotComparable, platform_name, require_same_platform
    from conformance.results.result import ResultsFileError, load_results

    try:
        doc = load_results(path)
    except ResultsFileError as exc:
        raise WaiverFileError(f"cannot read baseline {exc}") from None
    if not isinstance(doc.get("results"), list):
        raise WaiverFileError(f"baseline {path} is not a results file: expected an object with a 'results' list, "
                              f"found top-level keys {sorted(doc)}")
    try:
        require_same_platform((f"baseline {path}", platform_name(doc)), ("this run", platform))
    except NotComparable as exc:
        raise WaiverFileError(str(exc)) from None
    outcomes = {o.value for o in Outcome}
    baseline = {}
    for i, r in enumerate(doc["results"]):
        if not isinstance(r, dict) or not isinstance(r.get("check"), str) or r.get("outcome") not in outcomes:
            raise WaiverFileError(f"baseline {path}: results[{i}] is not a result (needs 'check' and a valid "
                                  f"'outcome')")
        baseline[result_key(r)] = r["outcome"]
    env = doc.get("environment")
    return Baseline(baseline, env.get("vllm") if isinstance(env, dict) else None)


def regression(result: CheckResult, baseline: Baseline, vllm_now: str | None = None) -> str | None:
    """A message when the baseline had PASS here and this run has anything else; when the two runs are on different
    vLLM releases it says so, since the change may be vLLM's rather than the plugin's."""
    before = baseline.get(result_key(result))
    if before == Outcome.PASS.value and result.outcome is not Outcome.PASS:
        from conformance.gate.comparable import release_change

        changed = release_change(baseline.vllm, vllm_now) if isinstance(baseline, Baseline) else None
        if changed:
            return (f"regression against the baseline: PASS before, {result.outcome.value} now, across a change of "
                    f"vLLM release ({changed}): vLLM's change or the plugin's; a baseline made on this release "
                    "tells them apart")
        return f"regression against the baseline: PASS before, {result.outcome.value} now"
    return None
