"""Global state a unit must leave as it found it, in every family (conformance.checks.common.side_effect_verdict,
applied by run_unit): the default generator, the default dtype, grad mode, torch's thread count."""

from __future__ import annotations

import pytest
import torch

from conformance.checks.common import (KernelRaised, Verdict, call_impl, drawing_default_generator, global_state,
                                       global_state_changes, side_effect_verdict)
from conformance.results.result import Outcome


@pytest.fixture
def kept_state():
    state = global_state()
    yield state
    from conformance.checks.common import restore_global_state

    restore_global_state(state)


def test_nothing_changed_keeps_the_verdict(kept_state):
    verdict = Verdict(Outcome.PASS, "fine")
    assert side_effect_verdict(verdict, global_state()) is verdict


@pytest.mark.parametrize("change,said", [
    (lambda: torch.manual_seed(0), "the default (CPU) generator was reseeded (torch.manual_seed(0)"),
    (lambda: call_impl("the kernel", torch.rand, 3), "the kernel: the default (CPU) generator was drawn from"),
    (lambda: torch.set_default_dtype(torch.float64), "the default dtype went from float32 to float64"),
    (lambda: torch.set_grad_enabled(not torch.is_grad_enabled()), "grad mode went from"),
    (lambda: torch.set_num_threads(torch.get_num_threads() + 1), "torch's thread count went from"),
])
def test_each_change_is_a_fail_naming_it_and_is_put_back(kept_state, change, said):
    before = global_state()
    change()
    verdict = side_effect_verdict(Verdict(Outcome.PASS, "the values were right"), before)
    assert verdict.outcome is Outcome.FAIL
    assert said in verdict.message and "changed global state it does not own" in verdict.message
    assert "(the check itself: PASS: the values were right)" in verdict.message
    assert global_state_changes(before) == []       # put back for the next unit


@pytest.mark.parametrize("unit,said", [
    (lambda: torch.manual_seed(7), "the kernel: the default (CPU) generator was reseeded (torch.manual_seed(7))"),
    (lambda: torch.rand(3), "the kernel: the default (CPU) generator was drawn from"),
])
def test_a_reseed_to_the_seed_the_process_had_reads_as_a_reseed_whatever_ran_before(kept_state, unit, said):
    """A kernel calling torch.manual_seed(7) in a process an earlier test seeded with 7: the seed does not move, the
    stream goes back to its start; that is a reseed, as in a fresh process, and a draw there is still a draw."""
    torch.manual_seed(7)
    torch.rand(2)                           # the process has used its stream since
    before = global_state()
    call_impl("the kernel", unit)
    verdict = side_effect_verdict(Verdict(Outcome.PASS, "ok"), before)
    assert verdict.outcome is Outcome.FAIL and said in verdict.message, verdict.message


def test_the_checks_own_draws_outside_the_platforms_code_are_not_a_finding_and_are_put_back(kept_state):
    before = global_state()
    torch.rand(5)                           # a check drawing its inputs, a model's initialisation
    verdict = side_effect_verdict(Verdict(Outcome.PASS, "ok"), before)
    assert verdict.outcome is Outcome.PASS
    assert torch.equal(torch.get_rng_state(), before.generators[0][2])     # the next unit starts alike


def test_a_constructor_may_initialise_from_the_default_generator_but_not_reseed_it(kept_state):
    before = global_state()
    call_impl("constructing vllm:Conv2dLayer", torch.nn.Linear, 4, 4)       # kaiming init draws
    assert side_effect_verdict(Verdict(Outcome.PASS, "ok"), before).outcome is Outcome.PASS

    def reseeding_constructor():
        torch.manual_seed(9)
        return torch.nn.Linear(4, 4)

    call_impl("constructing a layer", reseeding_constructor)
    verdict = side_effect_verdict(Verdict(Outcome.PASS, "ok"), before)
    assert verdict.outcome is Outcome.FAIL and "constructing a layer: the default (CPU) generator was reseeded" \
        in verdict.message


def test_a_kernel_that_reseeds_and_raises_is_an_error_that_names_both(kept_state):
    before = global_state()

    def kernel():
        torch.manual_seed(3)
        raise RuntimeError("boom")

    with pytest.raises(KernelRaised):
        call_impl("the kernel", kernel)
    verdict = side_effect_verdict(Verdict(Outcome.ERROR, "the kernel raised RuntimeError: boom"), before)
    assert verdict.outcome is Outcome.ERROR
    assert "the kernel: the default (CPU) generator was reseeded (torch.manual_seed(3)" in verdict.message


def test_a_failing_or_erroring_unit_keeps_its_outcome_and_gains_the_note(kept_state):
    before = global_state()
    torch.manual_seed(5)
    verdict = side_effect_verdict(Verdict(Outcome.ERROR, "raised"), before)
    assert verdict.outcome is Outcome.ERROR and verdict.message.startswith("raised; also, the unit changed")


def test_draws_the_sampler_may_make_are_forgiven_a_reseed_is_not(kept_state):
    before = global_state()
    with drawing_default_generator("the sampler"):
        call_impl("the sampler", torch.rand, 10)
    assert side_effect_verdict(Verdict(Outcome.PASS), before).outcome is Outcome.PASS
    with drawing_default_generator("the sampler"):
        torch.manual_seed(1)
        torch.rand(10)
    verdict = side_effect_verdict(Verdict(Outcome.PASS), before)
    assert verdict.outcome is Outcome.FAIL
    assert "the sampler: the default (CPU) generator was reseeded (torch.manual_seed(1)" in verdict.message
    assert global_state_changes(before) == []


def test_run_unit_applies_it_to_every_check(kept_state, monkeypatch):
    """A check body of any family that reseeds: run_unit's verdict is the FAIL."""
    import conformance.checks as checks
    from conformance.checks.common import CheckContext
    from conformance.collect.units import Unit

    def body(ctx, unit):
        torch.manual_seed(42)
        return Verdict(Outcome.PASS, "ok")

    monkeypatch.setattr(checks, "registry", lambda: {"numerics.ir_case": body})
    verdict, _ = checks.run_unit(CheckContext("cpu", object(), level="quick"), Unit("numerics", "ir_case", "x"))
    assert verdict.outcome is Outcome.FAIL and "torch.manual_seed(42)" in verdict.message
