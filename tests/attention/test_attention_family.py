"""The attention check family's verdicts on backends defined here: fp8 truncation as a quality finding, the dispatch
probes' three answers, a platform that brings no backend, and a selection hook that answers wrongly (compile:
test_attention_compile.py)."""

from __future__ import annotations

import pytest
import torch

from conformance.checks import CheckContext, records, run_unit
from conformance.collect.inventory import Inventory
from conformance.collect.units import Unit
from conformance.results.result import Outcome
from reference_impl.attention import kv_quant
from reference_impl.attention.reference import ReferenceAttentionBackend, ReferenceAttentionImpl
from reference_impl.platforms import Platform


class TruncatingImpl(ReferenceAttentionImpl):
    """Writes fp8 by rounding toward zero (as vLLM 0.32's CPU writer does)."""

    def _stored(self, x, scale, cache_dtype):
        if self.fp8 is None:
            return x.to(cache_dtype)
        return kv_quant.quantize(x.to(torch.float32) / scale, self.fp8, "truncate")


class RaisingSinksImpl(ReferenceAttentionImpl):
    def __init__(self, *args, sinks=None, **kwargs):
        if sinks is not None:
            raise NotImplementedError("no sinks here")
        super().__init__(*args, **kwargs)


class DroppingSinksImpl(ReferenceAttentionImpl):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sinks = None


class QueriesAtStartImpl(ReferenceAttentionImpl):
    """Places a non-causal request's queries at 0..q-1, before its context (an older CPU kernel's convention)."""

    def _query_positions(self, query_len, seq_len, causal, device):
        return super()._query_positions(query_len, seq_len, causal, device) - (0 if causal else seq_len - query_len)


class SymmetricAlibiImpl(ReferenceAttentionImpl):
    """Biases by -slope * |p - j|: keys after a non-causal query are penalised instead of raised."""

    def _alibi_distance(self, p, j):
        return (p - j).abs()


class AlwaysCausalBuilder(ReferenceAttentionBackend.get_builder_cls()):
    """Builds every batch as causal: a non-causal request never sees the keys after its queries."""

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        return super().build(common_prefix_len, common_attn_metadata.replace(causal=True), fast_build)


def _backend(impl, sinks_declared=True):
    class Backend(ReferenceAttentionBackend):
        @staticmethod
        def get_name():
            return "TEST_BACKEND"

        @staticmethod
        def get_impl_cls():
            return impl

        @classmethod
        def supports_sink(cls):
            return sinks_declared

    return Backend


Truncating = _backend(TruncatingImpl)
QueriesAtStart = _backend(QueriesAtStartImpl)
SymmetricAlibi = _backend(SymmetricAlibiImpl)


class AlwaysCausal(ReferenceAttentionBackend):
    @staticmethod
    def get_name():
        return "TEST_BACKEND"

    @staticmethod
    def get_builder_cls():
        return AlwaysCausalBuilder
RaisingUndeclared = _backend(RaisingSinksImpl, sinks_declared=False)
RaisingDeclared = _backend(RaisingSinksImpl, sinks_declared=True)
WrongUndeclared = _backend(DroppingSinksImpl, sinks_declared=False)
CorrectUndeclared = _backend(ReferenceAttentionImpl, sinks_declared=False)


class OnePlatform(Platform):
    def __init__(self, answer):
        self.answer = answer

    def get_attn_backend_cls(self, selected_backend, selector_config, num_heads=None):
        return self.answer


def _run(answer, check, level="quick", dtype="float32", case=None):
    platform = OnePlatform(answer)
    inventory = Inventory("test", platform, {}, {}, {})
    ctx = CheckContext("test", platform, seed=1234, level=level)
    record = records()[f"attention.{check}"]
    units = [u for u in record.units(inventory, "attention", check, level)
             if u.dtype in (None, dtype) and (case is None or u.case == case)]
    assert units, (check, case)
    return [(u, run_unit(ctx, u)[0]) for u in units]


def test_a_truncating_fp8_writer_is_a_quality_warning_naming_the_quantiser():
    results = _run(f"{__name__}.Truncating", "forward", case="decode+fp8_e4m3")
    ((unit, verdict),) = results
    assert verdict.outcome is Outcome.QUALITY_WARNING, verdict.message
    assert "rounds toward zero (truncates) where the contract rounds to nearest even" in verdict.message
    assert "the output matches the truncating quantiser's oracle within tolerance" in verdict.message
    assert unit.provider == f"{__name__}.Truncating"
    auto = _run(f"{__name__}.Truncating", "forward", case="decode")
    assert auto[0][1].outcome is Outcome.PASS


@pytest.mark.parametrize("answer, outcome, fragment", [
    ("CorrectUndeclared", Outcome.PASS, "attention sinks is declared unsupported (supports_sink()), yet computed "
                                        "within tolerance: declare it"),
    ("RaisingUndeclared", Outcome.NOT_SUPPORTED, "the backend refuses it: constructing"),
    ("RaisingDeclared", Outcome.FAIL, "attention sinks is declared (supports_sink()), but constructing"),
    ("WrongUndeclared", Outcome.FAIL, "a backend that cannot compute it must raise"),
])
def test_the_sinks_probe_tells_declared_from_working(answer, outcome, fragment):
    ((_, verdict),) = _run(f"{__name__}.{answer}", "dispatch", case="sinks")
    assert verdict.outcome is outcome and fragment in verdict.message, verdict.message


def test_a_platform_on_the_reference_backend_brings_nothing():
    results = _run("reference_impl.attention.reference.ReferenceAttentionBackend", "forward")
    assert [(u.provider, v.outcome) for u, v in results] == [("none", Outcome.NOT_IMPLEMENTED)]
    ((_, resolve),) = _run("reference_impl.attention.reference.ReferenceAttentionBackend", "dispatch")
    assert resolve.outcome is Outcome.PASS and "the platform brings no attention backend" in resolve.message


@pytest.mark.parametrize("answer, fragment", [
    ("no_such.module.Backend", "which does not resolve: ImportError"),
    (f"{__name__}.OnePlatform", "has no get_name, get_impl_cls, get_builder_cls, validate_configuration"),
])
def test_a_selection_that_does_not_resolve_fails_naming_it(answer, fragment):
    platform = OnePlatform(answer)
    ctx = CheckContext("test", platform, seed=1234, level="quick")
    verdict, _ = run_unit(ctx, Unit("attention", "dispatch", "attention", None, None, "resolve"))
    assert verdict.outcome is Outcome.FAIL and fragment in verdict.message, verdict.message


class DecodeFirstBuilder(ReferenceAttentionBackend.get_builder_cls()):
    """Takes decodes first only, and says so with reorder_batch_threshold (vLLM orders each batch for it)."""

    reorder_batch_threshold = 1

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        lens = common_attn_metadata.naive_query_lens().tolist()
        if any(a > 1 and b <= 1 for a, b in zip(lens, lens[1:])):
            raise ValueError(f"decodes must come first, got query lengths {lens}")
        return super().build(common_prefix_len, common_attn_metadata, fast_build)


class DecodeFirst(ReferenceAttentionBackend):
    @staticmethod
    def get_builder_cls():
        return DecodeFirstBuilder


def test_a_builder_with_a_reorder_threshold_gets_decodes_first():
    for check in ("forward", "cache_write", "aliasing", "steps"):
        results = _run(f"{__name__}.DecodeFirst", check, level="standard")
        bad = [f"{u.id}: {v.outcome.value} {v.message[:300]}" for u, v in results if v.outcome is not Outcome.PASS]
        assert not bad, bad


@pytest.mark.parametrize("answer, case, fragment", [
    ("QueriesAtStart", "non_causal_window", "places a non-causal request's queries at positions 0..query_len-1 "
                                            "instead of after its context (p = c + t)"),
    ("SymmetricAlibi", "non_causal_alibi", "biases keys after the query by -slope * |p - j| (symmetric ALiBi)"),
    ("AlwaysCausal", "non_causal_window", "keeps a one-sided window on non-causal attention"),
    ("AlwaysCausal", "non_causal", "computes as if causal=True (the metadata says causal=False)"),
])
def test_another_convention_for_non_causal_requests_with_context_fails_naming_it(answer, case, fragment):
    """The non-causal cases with context decide what the contract says (vLLM 0.32's CPU kernel computes it:
    tests/vllm_bridge/test_vllm_attention.py), and a backend on another convention is told which one it follows;
    the same backend passes the causal cases, where the conventions agree."""
    ((_, verdict),) = _run(f"{__name__}.{answer}", "forward", level="standard", case=case)
    assert verdict.outcome is Outcome.FAIL and fragment in verdict.message, verdict.message
    for causal_case in ("chunked_prefill", "softcap_alibi", "mixed_window"):
        ((_, verdict),) = _run(f"{__name__}.{answer}", "forward", case=causal_case)
        assert verdict.outcome is Outcome.PASS, (causal_case, verdict.message)
