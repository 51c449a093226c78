"""The engine family on a platform written against our own API: the reference runtime on the platform under test
(conformance/checks/engine/runtime.py), graded by the float64 oracle; a planted attention bug fails naming the
request, the step and whether the batch is involved."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conformance.checks import CheckContext, run_unit
from conformance.collect.inventory import activate
from conformance.collect.units import Unit
from conformance.results.result import Outcome


@pytest.fixture(scope="module")
def cpu_ctx():
    inventory = activate("cpu")
    return CheckContext("cpu", inventory.platform, seed=1234, level="standard")


def _generate(ctx, model="llama", dtype="float32"):
    return run_unit(ctx, Unit("engine", "generate", model, None, dtype, "eager"))[0]


@pytest.mark.parametrize("model", ["llama", "gemma2", "gpt_oss"])
def test_the_cpu_platform_runs_each_model_on_its_kernels_and_passes(cpu_ctx, model):
    verdict = _generate(cpu_ctx, model)
    assert verdict.outcome is Outcome.PASS, verdict.message
    assert verdict.message.startswith(f"44 generated positions ({model}) within logprob tolerance")
    # what of the platform ran: its C++ kernels and its attention backend over the paged cache
    assert verdict.message.count("attention backend: CPP") == 1 and "rms_norm: cpp" in verdict.message


def test_a_decode_that_reads_at_most_40_keys_fails_naming_request_and_step(cpu_ctx, monkeypatch):
    from reference_impl.attention import cpp_backend

    build = cpp_backend.CppAttentionMetadataBuilder.build

    def capped(self, *args, **kwargs):      # planted: a decode reads at most 40 keys of its request
        m = build(self, *args, **kwargs)
        query_lens = m.query_start_loc[1:] - m.query_start_loc[:-1]
        return dataclasses.replace(m, seq_lens=torch.maximum(m.seq_lens.clamp(max=40), query_lens))

    monkeypatch.setattr(cpp_backend.CppAttentionMetadataBuilder, "build", capped)
    verdict = _generate(cpu_ctx)
    assert verdict.outcome is Outcome.FAIL
    assert verdict.message.startswith(
        "the runtime on the platform leaves the float64 reference (teacher-forced on its tokens, logprob tolerance "
        "0.0018): llama: request 0 (wave 0, prompt of 51 tokens, 10 generated), step 1: ")
    assert ("generated alone it still diverges at step 1: the model path itself (a kernel, a layer or the attention "
            "backend), not the batch") in verdict.message
