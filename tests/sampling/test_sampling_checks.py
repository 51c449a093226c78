"""The sampling checks' failure paths on small hand-made platforms: bad input named, a sampler that returns the
wrong thing, raises, or reseeds the default generator."""

from __future__ import annotations

import torch

from conformance.checks import run_unit
from conformance.checks.common import CheckContext
from conformance.collect.units import Unit
from conformance.results.result import Outcome
from reference_impl import sampling as rs
from reference_impl.platforms import CpuPlatform


class WithSampler(CpuPlatform):
    def __init__(self, sampler):
        self._sampler = sampler

    def get_sampler(self):
        return self._sampler


def verdict(sampler, check, case, op="sample"):
    ctx = CheckContext("test", WithSampler(sampler), level="quick")
    return run_unit(ctx, Unit("sampling", check, op, None, "float32", case))[0]


def test_an_unknown_case_is_an_error_naming_the_cases():
    v = verdict(rs.Sampler(), "top_k_top_p", "nope", "apply_top_k_top_p")
    assert v.outcome is Outcome.ERROR and "sampling.top_k_top_p has no case 'nope': one of ('k1'," in v.message


class WrongShape(rs.Sampler):
    def apply_top_k_top_p(self, logits, k, p):
        return logits[:, :-1]


def test_a_mask_of_the_wrong_shape_fails_saying_so():
    v = verdict(WrongShape(), "top_k_top_p", "k1", "apply_top_k_top_p")
    assert v.outcome is Outcome.FAIL
    assert "returned a tensor of shape (8, 999) and dtype torch.float32 for logits of shape (8, 1000)" in v.message


class Raises(rs.Sampler):
    def sample(self, logits, batch):
        raise NotImplementedError("no min-p here")


def test_a_sampler_that_raises_is_an_error_naming_the_entry_point_and_case():
    v = verdict(Raises(), "sample", "top_k_top_p_min_p")
    assert v.outcome is Outcome.ERROR
    assert v.message.startswith("reference_impl.sampling.Sampler.sample (case top_k_top_p_min_p) raised "
                                "NotImplementedError: no min-p here")


class Reseeds(rs.Sampler):
    def sample(self, logits, batch):
        torch.manual_seed(1234)
        return super().sample(logits, batch)


def test_a_sampler_that_reseeds_the_default_generator_fails_though_its_draws_are_right():
    before = torch.random.initial_seed()
    v = verdict(Reseeds(), "sample", "no_filters")
    assert v.outcome is Outcome.FAIL
    assert "reference_impl.sampling.Sampler.sample: the default (CPU) generator was reseeded " \
           "(torch.manual_seed(1234))" in v.message
    assert "(the check itself: PASS:" in v.message
    assert torch.random.initial_seed() == before


class IgnoresSeeds(rs.Sampler):
    def sample(self, logits, batch):
        return super().sample(logits, rs.SamplingBatch(batch.temperature, batch.top_k, batch.top_p, batch.min_p, {}))


def test_a_sampler_that_ignores_the_requests_generators_fails_the_seeded_check():
    v = verdict(IgnoresSeeds(), "seeded", "alone_vs_batch")
    assert v.outcome is Outcome.FAIL and "a seeded request's tokens depend on what else runs" in v.message
