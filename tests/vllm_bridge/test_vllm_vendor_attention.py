"""`pytest --platform=vllm` on tests/plugins/vllm_attention: a plugin platform whose `get_attn_backend_cls` returns
the vendor's own backend class (named CUSTOM, never registered with vLLM) with the soft cap dropped. The bridge
grades that class, not whatever vLLM registers under its name; the results are the vendor's; the soft-capped cases
FAIL naming the soft cap and the others pass."""

from __future__ import annotations

import importlib.util

import pytest

from _vllm_cpu import FP8_REFUSED, fp8_refused_here
from harness_runner import PLUGINS, run_harness

VENDOR = PLUGINS / "vllm_attention"
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed here (bash scripts/setup.sh --vllm installs it)")
SOFT_CAP = "The output is the oracle's when the backend ignores logits_soft_cap (computes as if logits_soft_cap=None)"



@pytest.fixture(scope="module")
def vendor_run(tmp_path_factory):
    run = run_harness(tmp_path_factory.mktemp("vllm_vendor_attention"), "vllm", "-k", "attention and float32",
                      dist=VENDOR, timeout=900)
    assert run.doc is not None and run.doc["run"]["complete"], run.output[-3000:]
    return run


def _check(r) -> str:
    return r["nodeid"].split("::test_")[1].split("[")[0]


@needs_vllm
def test_the_vendors_backend_is_graded_and_its_results_are_the_vendors(vendor_run):
    doc = vendor_run.doc
    assert doc["platform"]["class"] == "conformance_vllm_attention.platform.AcmeAttnCpuPlatform"
    graded = vendor_run.where(op="attention")
    assert graded and {r["provider"] for r in graded} == {"CUSTOM"}
    for r in graded:
        assert r["origin"] == {"distribution": "conformance-vllm-attention", "version": "0.1.0",
                               "code": "conformance_vllm_attention.backend.AcmeAttentionBackend",
                               "upstream": False}, r
    # the dropped soft cap is the vendor's defect: it gates
    assert vendor_run.returncode == 1 and doc["verdict"] == "NOT_CONFORMANT"


@needs_vllm
def test_the_dropped_soft_cap_fails_naming_it_and_nothing_else_fails(vendor_run):
    graded = vendor_run.where(op="attention")
    if fp8_refused_here():   # the vendor's backend is vLLM's CPU_ATTN underneath: its builder refuses fp8 here
        refused = [r for r in graded if "fp8" in r["case"]]
        assert refused and all(r["outcome"] in ("FAIL", "ERROR") for r in refused), refused
        assert all(any(refusal in r["message"] for refusal in FP8_REFUSED) for r in refused), refused
        graded = [r for r in graded if "fp8" not in r["case"]]
    failed = {(_check(r), r["case"]) for r in graded if r["outcome"] in ("FAIL", "ERROR", "CRASH")}
    assert failed == {("forward", "softcap_alibi"), ("steps", "steps")}, failed
    for r in graded:
        if r["outcome"] == "FAIL":
            assert SOFT_CAP in r["message"], r["message"]
    # every forward case without a soft cap is vLLM's kernel computing right (fp8 ones: its truncating writer)
    others = [r for r in graded if _check(r) == "forward" and r["case"] != "softcap_alibi"]
    assert others and {r["outcome"] for r in others} <= {"PASS", "QUALITY_WARNING"}
