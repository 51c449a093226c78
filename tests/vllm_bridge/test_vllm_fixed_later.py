"""conformance/vllm/fixed_later.py: a failure that is a known defect of an older vLLM release stays graded as
observed and names the release that fixes it; nothing else is named."""

from __future__ import annotations

import pytest

from conformance.results.result import Outcome
from conformance.vllm.fixed_later import FIXED_LATER, fixed_later_note

FP8 = "do_kv_cache_update (the context) raised RuntimeError: FP8 KV cache is only supported on x86 (AMX/VEC) ISA"
SEEDED_OP = ("a seeded request's tokens depend on what else runs: request (seed 1, ...) [vllm.v1.sample.ops."
             "topk_topp_sampler.TopKTopPSampler.forward_cpu]")
SEEDED_ENGINE = ("request 1 (...): a seeded request drew [1] alone where it drew [2] in the first batch of 7 [vLLM's "
                 "engine on the platform, llama float32 (vocab 512), vllm.platforms.cpu.CpuPlatform; ...]")
NGRAM = ("n-gram speculative decoding (3 draft tokens): before any answer, with the greedy requests (0, 1, 2), vLLM's "
         "engine raised TypeError: Cannot inspect kernel parameters for function [vLLM's engine on the platform, "
         "llama float32 (vocab 512), vllm.platforms.cpu.CpuPlatform; ...]")
AMX_MOE = ("vLLM's engine raised on model gpt_oss: RuntimeError: CPU fused-MoE AMX grouped-gemm kernel cannot be used "
           "for a layer with w13 shape (4, 512, 128)")
MOE = "vLLM's engine raised on model gpt_oss: RuntimeError: expected scalar type BFloat16 but found Float"


@pytest.mark.parametrize("release, family, op, outcome, message, fixed_in", [
    ("0.28.0", "attention", "attention", Outcome.ERROR, FP8, "0.29"),
    ("0.28.0", "attention", "attention", Outcome.FAIL, FP8, "0.29"),
    ("0.29.0", "attention", "attention", Outcome.ERROR, FP8, None),          # fixed there: not this defect
    ("0.28.0", "attention", "attention", Outcome.QUALITY_WARNING, FP8, None),  # not a failure
    ("0.28.0", "attention", "attention", Outcome.ERROR, "another refusal", None),
    ("0.28.0", "numerics", "attention", Outcome.ERROR, FP8, None),           # another family
    ("0.30.0", "engine", "gpt_oss", Outcome.ERROR, MOE, "0.31"),
    ("0.30.0", "engine", "llama", Outcome.ERROR, MOE, None),                  # the defect is gpt-oss's MoE
    ("0.31.0", "engine", "gpt_oss", Outcome.ERROR, MOE, None),
    ("0.28.0+cpu", "engine", "gpt_oss", Outcome.ERROR, MOE, "0.31"),
    (None, "engine", "gpt_oss", Outcome.ERROR, MOE, None),                    # not a vLLM run
    ("0.28.0", "sampling", "sample", Outcome.FAIL, SEEDED_OP, "0.29"),
    ("0.27.0", "engine", "gpt_oss", Outcome.ERROR, AMX_MOE, "0.28"),
    ("0.27.0", "engine", "mixtral", Outcome.ERROR, AMX_MOE.replace("gpt_oss", "mixtral"), "0.28"),
    ("0.28.0", "engine", "gpt_oss", Outcome.ERROR, AMX_MOE, None),
    ("0.29.0", "sampling", "sample", Outcome.FAIL, SEEDED_OP, None),
    ("0.28.0", "sampling", "sample", Outcome.FAIL, SEEDED_OP.replace("vllm.v1", "vendor"), None),  # a vendor's sampler
    ("0.28.0", "sampling", "llama", Outcome.FAIL, SEEDED_ENGINE, "0.29"),
    ("0.28.0", "sampling", "llama", Outcome.FAIL, SEEDED_ENGINE.replace("vllm.platforms.cpu.", "vendor."), None),
    ("0.30.0", "sampling", "llama", Outcome.ERROR, NGRAM, "0.31"),
    ("0.31.0", "sampling", "llama", Outcome.ERROR, NGRAM, None),
])
def test_a_known_defect_names_the_release_that_fixes_it(release, family, op, outcome, message, fixed_in):
    note = fixed_later_note(release, family, op, outcome, message)
    if fixed_in is None:
        assert note is None
    else:
        assert note.startswith(f" [vLLM's own defect on vLLM {release}; vLLM {fixed_in} fixes it: ")


def test_every_entry_is_a_release_inside_the_window():
    from conformance.vllm.discover import SUPPORTED_RELEASES

    assert all(entry.fixed_in in SUPPORTED_RELEASES for entry in FIXED_LATER)
