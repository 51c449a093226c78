"""The planted faults of the sampling family and the reseeding kernel, each caught with a message naming the request
and the parameter; the correct twin passes every check (tests/plugins/broken/conformance_broken/sampling_*.py)."""

from __future__ import annotations

import re

import pytest
import torch

from _sampling_fixtures import fixture_platform, run_checks
from conformance.results.result import Outcome


def results_of(name: str, **kw):
    with fixture_platform(name) as platform:
        return run_checks(f"broken_{name}", lambda: platform, **kw)


def failures(results, check: str) -> list[str]:
    return [v.message for u, v in results if u.check == check and v.outcome is Outcome.FAIL]


def test_the_correct_sampler_twin_passes_every_sampling_check():
    results = results_of("sampling_control")
    assert len(results) >= 20
    bad = [f"{u.check}.{u.case}: {v.outcome.value} {v.message}" for u, v in results if v.outcome is not Outcome.PASS]
    assert bad == []


def test_temperature_after_top_p_fails_naming_the_request_and_its_temperature():
    results = results_of("sampling_temp_after_top_p", checks=("top_k_top_p", "sample"))
    # the masks are right (the fault is the order): every top_k_top_p unit passes
    assert all(v.outcome is Outcome.PASS for u, v in results if u.check == "top_k_top_p")
    failed = failures(results, "sample")
    assert len(failed) >= 2, failed
    for message in failed:
        assert re.search(r"^request \d+ \(temperature=[\d.]+", message), message
        assert "exact binomial" in message or "probability 0" in message, message
    # the case whose point is the order: its first request draws tokens the oracle gives probability 0
    temp_top_p = [v.message for u, v in results if u.case == "temp_top_p"][0]
    assert "where the oracle gives it probability 0" in temp_top_p


def test_a_top_p_boundary_off_by_one_fails_in_the_mask_and_in_distribution():
    results = results_of("sampling_top_p_off_by_one", checks=("top_k_top_p", "sample"))
    masks = failures(results, "top_k_top_p")
    assert any("top_p=" in m and "is dropped (-inf) where the oracle keeps it" in m for m in masks), masks
    assert any(re.search(r"request \d+ \(top_p=[\d.]+", m) for m in masks), masks
    ties = [v.message for u, v in results if u.check == "top_k_top_p" and u.case == "topp_ties"][0]
    assert "tied at logit" in ties and "are kept where vLLM's rule keeps" in ties
    draws = failures(results, "sample")
    assert draws and all("top_p=" in m for m in draws), draws
    # top-k alone never reaches top-p: those units still pass
    assert all(v.outcome is Outcome.PASS for u, v in results if u.case in ("k1", "k_only", "k_vocab"))


def test_a_rejection_sampler_whose_uniform_is_zero_accepts_every_draft_and_fails():
    results = results_of("sampling_uniform_zero", checks=("rejection", "rejection_distribution"))
    exact = failures(results, "rejection")
    assert exact, results
    assert all(re.match(r"request \d+ \(sampling, \d+ draft tokens\)", m) for m in exact), exact
    assert all("against uniform" in m and "the oracle must reject" in m for m in exact), exact
    greedy = [v for u, v in results if u.check == "rejection" and u.case == "greedy"][0]
    assert greedy.outcome is Outcome.PASS          # greedy requests use no uniform
    dist = failures(results, "rejection_distribution")
    assert len(dist) == 2 and all("3000 of 3000 draft tokens accepted" in m for m in dist), dist


def test_a_kernel_that_reseeds_the_default_generator_fails_in_the_family_that_runs_it():
    before = torch.random.initial_seed(), torch.get_rng_state()
    results = results_of("reseeds_generator", family="numerics", checks=("ir_case",))
    broken = [(u, v) for u, v in results if u.provider == "broken"]
    assert broken
    for unit, verdict in broken:
        assert verdict.outcome is Outcome.FAIL, (unit, verdict)
        assert verdict.message.startswith(
            "the unit changed global state it does not own: provider 'broken' of rms_norm: the default (CPU) "
            "generator was reseeded (torch.manual_seed(0)) (every later computation"), verdict.message
    # every unit put the generator back: the test process's default generator is as it was
    assert torch.random.initial_seed() == before[0] and torch.equal(torch.get_rng_state(), before[1])
    # the other providers of the same op in the same run are not blamed
    assert all(v.outcome is not Outcome.FAIL for u, v in results if u.provider != "broken")


@pytest.mark.parametrize("name", ["sampling_temp_after_top_p", "sampling_top_p_off_by_one", "sampling_uniform_zero"])
def test_the_same_run_gives_the_same_messages(name):
    first = [(u.id, v.outcome, v.message) for u, v in results_of(name, checks=("top_k_top_p", "rejection"))]
    second = [(u.id, v.outcome, v.message) for u, v in results_of(name, checks=("top_k_top_p", "rejection"))]
    assert first == second
