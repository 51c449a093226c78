"""Poisoned providers in-process: two real TIMEOUTs (or eight CRASHes) of one provider and op stop its other
checks, for every process that shares the run directory, as SKIP results that say they were not run."""

from __future__ import annotations

import pytest

from conformance.collect.units import Unit
from conformance.results.result import Outcome
from conformance.run.poison import PoisonBook
from conformance.run.run_dir import RunDir


@pytest.fixture
def run_dir():
    rd = RunDir.create()
    yield rd
    rd.remove()


def _unit(case: str, provider: str = "p", op: str = "rms_norm", family: str = "numerics") -> Unit:
    return Unit(family, "ir_case", op, provider, "float32", case)


@pytest.mark.parametrize("outcome, verb, limit, why", [
    (Outcome.TIMEOUT, "hung", 2, "skipped rather than waiting out the time limit again"),
    (Outcome.CRASH, "crashed", 8, "skipped rather than crashing yet another worker")])
def test_repeated_timeouts_or_crashes_poison_the_provider_of_that_op_only(run_dir, outcome, verb, limit, why):
    """Two hangs, or eight crashes (a crash costs a fresh worker, not a time limit, and a kernel that dies on some
    shapes only must not hide the others), end the provider's other checks of that op as SKIP "not run": never the
    TIMEOUT or CRASH they did not have."""
    book = PoisonBook(run_dir)
    for i in range(limit - 1):
        book.record(_unit(f"a{i}"), outcome)
        assert book.check(_unit("b")) is None               # not enough yet: it may be those inputs
    book.record(_unit("z"), outcome)
    found = book.check(_unit("c"))
    assert found is not None and found[0] is Outcome.SKIP
    assert found[1] == (f"not run: provider p of op rms_norm {verb} in numerics.ir_case [rms_norm-p-float32-a0] "
                        f"earlier ({limit} {outcome.value} results); {why} (its own outcome was not observed)")
    assert book.check(_unit("c", provider="q")) is None      # another provider of the op runs
    assert book.check(_unit("c", op="fused_add_rms_norm")) is None


def test_other_outcomes_and_mixed_failures_do_not_poison(run_dir):
    book = PoisonBook(run_dir)
    for outcome in (Outcome.FAIL, Outcome.ERROR, Outcome.PASS):
        book.record(_unit("a"), outcome)
    assert book.check(_unit("b")) is None
    book.record(_unit("a"), Outcome.TIMEOUT)
    book.record(_unit("b"), Outcome.CRASH)
    assert book.check(_unit("c")) is None                  # one of each kind: neither has happened twice


def test_knowledge_is_shared_through_the_directory_and_reaches_the_model(run_dir):
    PoisonBook(run_dir).record(_unit("a"), Outcome.TIMEOUT)
    other_worker = PoisonBook(RunDir(run_dir.path))        # an xdist worker opens the same path
    other_worker.record(_unit("b"), Outcome.TIMEOUT)
    assert PoisonBook(run_dir).check(_unit("c"))[0] is Outcome.SKIP
    model = Unit("model", "decoder", "decoder", None, "float32", "eager")
    assert other_worker.check(model) is None                # the model's providers were not named
    found = other_worker.check(model, [("silu_and_mul", "x"), ("rms_norm", "p")])
    assert found is not None and "the model runs the platform's default providers, and provider p" in found[1]


def test_run_dir_skips_a_partly_written_line_and_only_its_creator_removes_it(run_dir):
    run_dir.append("x.jsonl", {"a": 1})
    with open(f"{run_dir.path}/x.jsonl", "a") as fh:
        fh.write('{"a": ')                                   # a line another process is still writing
    assert run_dir.records("x.jsonl") == [{"a": 1}]
    RunDir(run_dir.path).remove()
    assert run_dir.records("x.jsonl") == [{"a": 1}]
