"""The vLLM bridge's sampler on the installed vLLM (skipped without it): which forward vLLM's platform picks, the
kernel overrides the rejection sampler dispatches to, and the family's verdicts on vLLM 0.32's CpuPlatform."""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def vllm_inventory():
    from _registrations import registrations_undone
    from conformance.collect.inventory import activate

    with registrations_undone():   # the bridge's layers and providers stay out of the later tests of this worker
        yield activate("vllm")


def unit(check, case, op):
    from conformance.collect.units import Unit

    return Unit("sampling", check, op, None, "float32", case)


def run(inventory, u, level="quick"):
    from conformance.checks import run_unit
    from conformance.checks.common import CheckContext

    return run_unit(CheckContext("vllm", inventory.platform, level=level), u)[0]


def test_the_bridge_builds_vllms_sampler_with_the_platforms_forward_and_overrides(vllm_inventory):
    sampler = vllm_inventory.platform.get_sampler()
    forward = sampler.name.rsplit(".", 1)[-1]
    assert forward.startswith("forward_")
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        assert forward in ("forward_cpu", "forward_native")
        from vllm.triton_utils import HAS_TRITON

        if not HAS_TRITON:   # vLLM's CPU platform then registers C++ kernels for the rejection sampler
            assert "rejection_random_sample_kernel -> vllm.utils.cpu_triton_utils." in sampler.rejection_name


def test_vllm_samples_in_distribution_and_keeps_seeded_requests(vllm_inventory):
    from conformance.results.result import Outcome

    for u in (unit("sample", "temp_top_p", "sample"), unit("seeded", "alone_vs_batch", "sample"),
              unit("rejection_distribution", "draft_probs", "rejection_sample")):
        verdict = run(vllm_inventory, u)
        assert verdict.outcome is Outcome.PASS, verdict.message


def test_vllm_032_cpu_accepts_a_padded_draft_token_in_its_cpp_rejection_kernel(vllm_inventory):
    """Recorded in docs/sampling.md: the C++ override accepts a draft token of -1 that vLLM's Triton kernel
    rejects. Asserted where that override is what runs."""
    sampler = vllm_inventory.platform.get_sampler()
    if "cpu_triton_utils._rejection_random_sample_kernel_impl" not in sampler.rejection_name:
        pytest.skip("the platform does not run vLLM's C++ rejection kernel")
    from conformance.results.result import Outcome

    verdict = run(vllm_inventory, unit("rejection", "mixed", "rejection_sample"))
    assert verdict.outcome is Outcome.FAIL
    assert "a padded draft token (-1), which must be rejected" in verdict.message
    assert verdict.message.startswith("request 3 (sampling, 3 draft tokens): output [-1,")
