"""Poisoned providers: after a provider of an op has timed out twice (or crashed eight times), its other
checks are not run instead of waiting out the time limit again.

Only observed outcomes are recorded: the real TIMEOUT/CRASH results stay in the results file (and keep the
verdict NOT_CONFORMANT); the checks that were not run are SKIP results saying "not run: provider X of op Y
hung in <check> earlier", never a TIMEOUT or CRASH they did not have. A hang costs the time limit, so two
are enough; a crash costs a fresh worker (about half a second forked from the zygote), and a kernel that
crashes on some shapes (vLLM 0.32's bfloat16 rotary where rotary_dim / 2 is no multiple of 8) must not hide
the shapes it handles, so crashes poison only past their own limit (LIMITS), which bounds the cost of a kernel
that dies on every input. The run directory holds what was learned, so every xdist worker sees it.
"""

from __future__ import annotations

from collections.abc import Iterable

from conformance.collect.units import Unit
from conformance.results.result import Outcome
from conformance.run.run_dir import RunDir

RECORDS = "poisoned.jsonl"
# real TIMEOUTs / CRASHes of one provider and op before its other checks are not run
LIMITS = {Outcome.TIMEOUT.value: 2, Outcome.CRASH.value: 8}
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
            if len(where) >= LIMITS[outcome]:
                return Outcome(outcome), (f"{_subject(op, provider)} {VERB[outcome]} in {where[0]} earlier "
                                          f"({len(where)} {outcome} results)")
        return None

    def check(self, unit: Unit, model_providers: Iterable[tuple[str, str]] = ()) -> tuple[Outcome, str] | None:
        """(SKIP, message) when `unit` must not run: its own provider and op is poisoned, or it is a model
        check and one of `model_providers` (the platform's default (op, provider) pairs) is. The message
        names the real results; the SKIP claims nothing about this check's own behaviour."""
        found = self._verdict(unit.op, unit.provider)
        if found is not None:
            outcome, why = found
            return Outcome.SKIP, f"not run: {why}; {_not_again(outcome)}"
        if unit.family == "model":
            for op, provider in model_providers:
                found = self._verdict(op, provider)
                if found is not None:
                    outcome, why = found
                    return Outcome.SKIP, (f"not run: the model runs the platform's default providers, and {why}; "
                                          f"{_not_again(outcome)}")
        return None


def _not_again(outcome: Outcome) -> str:
    """Why the check is skipped rather than run: what running it again would cost."""
    if outcome is Outcome.TIMEOUT:
        return "skipped rather than waiting out the time limit again (its own outcome was not observed)"
    return "skipped rather than crashing yet another worker (its own outcome was not observed)"
