"""Poisoned providers: after a provider of an op has timed out twice (or crashed twice), its other
checks end at once with the same outcome instead of waiting out the time limit again.

The first real TIMEOUT/CRASH results stay in the results file; the rest say "not run: provider X
of op Y hung in <check> earlier". The knowledge lives in the run directory, so every xdist worker
sees what any of them learned and a hanging provider costs about two time limits, not one per check.
"""

from __future__ import annotations

from collections.abc import Iterable

from conformance.collect.units import Unit
from conformance.results.result import Outcome
from conformance.run.run_dir import RunDir

RECORDS = "poisoned.jsonl"
LIMIT = 2   # real TIMEOUTs (or CRASHes) of one provider and op before its other checks are not run
VERB = {Outcome.TIMEOUT.value: "hung", Outcome.CRASH.value: "crashed"}


def _key(op: str | None, provider: str | None) -> list:
    return [op, provider]


def _subject(op: str | None, provider: str | None) -> str:
    return f"provider {provider} of op {op}" if provider else f"{op}"


class PoisonBook:
    """Reads and appends the run directory's record of TIMEOUT and CRASH results."""

    def __init__(self, run_dir: RunDir):
        self.run_dir = run_dir

    def record(self, unit: Unit, outcome: Outcome) -> None:
        """Note a real TIMEOUT or CRASH of `unit` (other outcomes are ignored)."""
        if outcome.value in VERB:
            self.run_dir.append(RECORDS, {"key": _key(unit.op, unit.provider), "outcome": outcome.value,
                                          "where": f"{unit.family}.{unit.check} [{unit.id}]"})

    def _verdict(self, op: str | None, provider: str | None) -> tuple[Outcome, str] | None:
        by_outcome: dict[str, list[str]] = {}
        for rec in self.run_dir.records(RECORDS):
            if rec.get("key") == _key(op, provider):
                by_outcome.setdefault(rec["outcome"], []).append(rec["where"])
        for outcome, where in by_outcome.items():
            if len(where) >= LIMIT:
                return Outcome(outcome), (f"{_subject(op, provider)} {VERB[outcome]} in {where[0]} earlier "
                                          f"({len(where)} {outcome} results)")
        return None

    def check(self, unit: Unit, model_providers: Iterable[tuple[str, str]] = ()) -> tuple[Outcome, str] | None:
        """(outcome, message) when `unit` must not run: its own provider and op is poisoned, or it is a
        model check and one of `model_providers` (the platform's default (op, provider) pairs) is."""
        found = self._verdict(unit.op, unit.provider)
        if found is not None:
            outcome, why = found
            return outcome, f"not run: {why}; {outcome.value} without running it again"
        if unit.family == "model":
            for op, provider in model_providers:
                found = self._verdict(op, provider)
                if found is not None:
                    outcome, why = found
                    return outcome, (f"not run: the model runs the platform's default providers, and {why}; "
                                     f"{outcome.value} without running it again")
        return None
