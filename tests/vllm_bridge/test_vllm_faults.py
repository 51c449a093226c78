"""`pytest --platform=vllm` on tests/plugins/vllm_faults: a vLLM plugin (vLLM's public API only) whose
register_oot replacements compute the right values while the vendor's own code never runs, and whose
QuantFP8 does not saturate. Each is a FAIL naming what the class defines, what vLLM runs instead and
the fix; the control replacement passes."""

from __future__ import annotations

import importlib.util

import pytest

from harness_runner import PLUGINS, run_harness

FAULTS = PLUGINS / "vllm_faults"
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed here (bash scripts/setup.sh --vllm installs it)")



@pytest.fixture(scope="module")
def faults_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_faults")
    selection = ("oot_dispatch and (silu_and_mul or gelu_and_mul or rms_norm or mul_and_silu or rotary_embedding "
                 "or quant_fp8) or layer_case and quant_fp8")
    run = run_harness(tmp, "vllm", "-k", selection, dist=FAULTS, timeout=600)
    assert run.doc is not None and run.doc["run"]["complete"], run.output[-3000:]
    return run


def _dispatch(run, op):
    """The one dispatch.oot_dispatch result of `op`."""
    [result] = [r for r in run.where(check="dispatch", op=op) if "test_oot_dispatch[" in r["nodeid"]]
    return result


def _message(run, op):
    result = _dispatch(run, op)
    assert result["outcome"] == "FAIL", result
    return result["message"]


@needs_vllm
def test_the_faulty_plugin_is_not_conformant_under_its_own_platform(faults_run):
    assert faults_run.returncode == 1 and faults_run.doc["verdict"] == "NOT_CONFORMANT"
    assert faults_run.doc["platform"]["class"] == "conformance_vllm_faults.platform.FaultsCpuPlatform"


@needs_vllm
def test_a_replacement_defining_only_forward_cuda_fails_naming_forward_oot(faults_run):
    assert _message(faults_run, "silu_and_mul") == (
        "AcmeSiluAndMul defines forward_cuda only; on this platform vLLM runs SiluAndMul.forward_oot (vLLM's code, "
        "inherited from CustomOp), which runs SiluAndMul.forward_native: define forward_oot")


@needs_vllm
def test_a_replacement_whose_enabled_says_no_fails_naming_the_override(faults_run):
    assert _message(faults_run, "gelu_and_mul") == (
        "AcmeGeluAndMul defines enabled, forward_oot; on this platform vLLM runs GeluAndMul.forward_native (vLLM's "
        "code), because AcmeGeluAndMul.enabled() returns False with custom ops on: drop the enabled() override (or "
        "return super().enabled()) so the op follows custom_ops and forward_oot runs")


@needs_vllm
def test_a_dispatch_forward_that_skips_forward_oot_fails_naming_the_override(faults_run):
    assert _message(faults_run, "rms_norm") == (
        "AcmeRMSNorm defines dispatch_forward, forward_oot; on this platform vLLM runs RMSNorm.forward_native (vLLM's "
        "code), because AcmeRMSNorm.dispatch_forward picks forward_native where vLLM's own dispatch_forward picks "
        "forward_oot: drop the dispatch_forward override (or return self.forward_oot on this platform)")


@needs_vllm
def test_the_control_and_vllms_own_classes_pass_saying_what_ran(faults_run):
    rotary = _dispatch(faults_run, "rotary_embedding")
    assert rotary["outcome"] == "PASS" and rotary["message"] == (
        "vLLM builds its own RotaryEmbedding (no register_oot replacement) and runs RotaryEmbedding.forward_oot "
        "(vLLM's code, inherited from CustomOp) on this platform")
    control = _dispatch(faults_run, "mul_and_silu")
    assert control["outcome"] == "PASS" and control["message"] == (
        "vLLM builds AcmeMulAndSilu and runs AcmeMulAndSilu.forward_oot (the plugin's code) on this platform; its own "
        "code ran: AcmeMulAndSilu.forward_oot")
    quant = _dispatch(faults_run, "quant_fp8")
    assert quant["outcome"] == "PASS" and quant["message"] == (
        "vLLM builds AcmeQuantFP8 and runs AcmeQuantFP8.forward_oot (the plugin's code) on this platform; its own code "
        "ran: AcmeQuantFP8.forward_oot")


@needs_vllm
def test_a_quantfp8_that_does_not_saturate_fails_the_saturated_cases_it_inherits_from_the_op(faults_run):
    """QuantFP8's cases include static_quant_fp8's saturated ones (scales calibrated on a quarter of the range):
    only those fail, in every dtype, and the cause hint names the clamp."""
    layer = dict(check="numerics", op="quant_fp8", provider="vllm:AcmeQuantFP8")
    failing = {r["case"] for r in faults_run.where(**layer, outcome="FAIL")}
    assert failing == {f"static,tokens=4,hidden=256,saturated,{kind}" for kind in ("per_tensor", "per_token",
                                                                                     "per_group")}
    assert len(faults_run.where(**layer, outcome="FAIL")) == 9
    assert faults_run.outcomes(**layer) == {"PASS", "FAIL"}
    assert all("got nan, native" in r["message"] for r in faults_run.where(**layer, outcome="FAIL"))
    assert "clamp x/scale to +-448 before the fp8 conversion" in faults_run.output
