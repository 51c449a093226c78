"""vLLM's own defects that a later release of the supported window fixed: a result that shows one on an older release
stays vLLM's (graded as it was observed), and its message names the release that fixes it, so a vendor pinned to
that release knows the failure is not theirs and what moving the pin would change.

Each entry was found by running the standard level on every release of the window
(scripts/vllm_release_runs.py; docs/vllm.md, "Each release of the window") and reading both releases' code; its
`fragment` is part of the message vLLM's code raised, so an unrelated failure of the same check is never named.
"""

from __future__ import annotations

import dataclasses

from conformance.results.result import Outcome

GATING = frozenset({Outcome.FAIL, Outcome.ERROR, Outcome.CRASH})


@dataclasses.dataclass(frozen=True)
class FixedLater:
    fixed_in: str        # the first release without the defect ("0.29")
    family: str          # the family of the results it shows in
    fragment: str        # part of the message vLLM raised
    what: str            # the defect, and what the fixing release changed
    op: str | None = None
    also: tuple[str, ...] = ()   # more parts the message must hold: the vLLM class or platform that ran

    def applies(self, release: str, family: str, op: str | None, message: str | None) -> bool:
        text = message or ""
        return (_key(release) < _key(self.fixed_in) and family == self.family and self.op in (None, op)
                and all(part in text for part in (self.fragment, *self.also)))


_SEEDED_0_28 = ("TopKTopPSampler.forward_cpu samples the whole batch from the global generator, ignoring every "
                "request's own generator, whenever the batch mixes seeded and unseeded requests (its test is "
                "len(generators) != batch size); 0.29 uses the generators whenever any request has one")

FIXED_LATER = (
    FixedLater("0.28", "engine", "CPU fused-MoE AMX grouped-gemm kernel cannot be used",
               "on a CPU with AMX, CPUFusedMOE takes only bfloat16 MoE weights and raises for any other dtype, blaming "
               "the layer's sizes (256, which is a multiple of 32); 0.28's CPU MoE takes float32 weights there "
               "(gpt-oss in float32 loads on 0.28; from 0.31 it runs)"),
    FixedLater("0.29", "attention", "FP8 KV cache is only supported on x86 (AMX/VEC) ISA",
               "CPU_ATTN declares kernel block sizes MultipleOf(16) and the fp8 KV cache, but its block-16 (vec16) "
               "kernel refuses fp8; 0.29 declares MultipleOf(32), whose kernels take fp8"),
    FixedLater("0.31", "engine", "expected scalar type BFloat16 but found Float",
               "gpt-oss's attention sinks in float32 reach CPU_ATTN's kernel (vllm._custom_ops."
               "cpu_attention_with_kv_cache), which takes sinks only in bfloat16; 0.31 computes them",
               op="gpt_oss"),
    FixedLater("0.29", "sampling", "a seeded request's tokens depend on what else runs", _SEEDED_0_28,
               also=("vllm.v1.sample.ops.topk_topp_sampler.TopKTopPSampler",)),
    FixedLater("0.29", "sampling", "a seeded request drew", _SEEDED_0_28, op="llama",
               also=("vllm.platforms.cpu.CpuPlatform",)),
    FixedLater("0.31", "sampling", "Cannot inspect kernel parameters for function",
               "n-gram speculative decoding's rejection sampler launches its Triton kernels (through "
               "jit_warmup_triton_helper) on the CPU, where vLLM's CpuPlatform registers no replacement; 0.31 adds "
               "Platform.register_triton_kernel_overrides and CpuPlatform's C++ rejection kernels", op="llama",
               also=("vllm.platforms.cpu.CpuPlatform",)),
)


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in release.split("+")[0].split(".")[:2])


def fixed_later_note(release: str | None, family: str, op: str | None, outcome: Outcome,
                     message: str | None) -> str | None:
    """' [vLLM's own defect on X; vLLM Y fixes it: ...]' for a failing result of a known defect, else None."""
    if release is None or outcome not in GATING:
        return None
    for entry in FIXED_LATER:
        if entry.applies(release, family, op, message):
            return f" [vLLM's own defect on vLLM {release}; vLLM {entry.fixed_in} fixes it: {entry.what}]"
    return None
