"""The engine family through vLLM's real engine on the fixture plugins: tests/plugins/vllm_engine's `stale_cpu`, whose
attention builder keeps the previous batch's seq_lens on decode steps, FAILs naming the model, request, step and the
batch composition, and its twin `fresh_cpu` passes with prefix-cache hits; vllm_good (out of tree, its own worker)
passes; vllm_faults' renamed device cannot start an engine, and the ERROR says why; vllm_attention's backend, which
drops the soft cap, FAILs on Gemma-2. The check body runs in this process (it needs no platform: its engine process
resolves vLLM's, from VLLM_PLUGINS), on one model (the faults are the plugins', whatever the model), with no time
limit on the reruns that explain a divergence (the harness's limit is for a loaded machine's per-check timeout); one
engine process per plugin, under a minute each on an idle 2-core machine."""

from __future__ import annotations

import importlib.util
import os

import pytest

from conformance.checks import engine
from conformance.checks.engine import models as engine_models
from conformance.checks.common import CheckContext
from conformance.collect.units import Unit
from conformance.results.result import Outcome
from harness_runner import PLUGINS

FIXTURE = PLUGINS / "vllm_engine"
pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vLLM is not installed here (bash scripts/setup.sh --vllm installs it)")]
UNIT = Unit("engine", "generate", None, None, "float32", "eager")



def _bridged():
    """A stand-in for the bridge's platform: the unit takes the vLLM path (the engine process reads VLLM_PLUGINS)."""
    import types

    import torch

    from conformance.vllm.platform import VllmPlatform

    vp = types.SimpleNamespace(device_name="cpu", device_type="cpu", dispatch_key="CPU",
                               supported_dtypes=[torch.float32])
    return VllmPlatform(types.SimpleNamespace(platform=vp))


def _verdict(plugin: str, fixture=FIXTURE, model: str = "llama"):
    mp = pytest.MonkeyPatch()
    mp.setattr(engine_models, "MODELS", {model: engine_models.MODELS[model]})
    mp.setattr(engine, "EXPLAIN_WITHIN_S", float("inf"))
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "VLLM_PLUGINS")}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(fixture), saved["PYTHONPATH"]]))
    os.environ["VLLM_PLUGINS"] = plugin
    try:
        return engine.generate(CheckContext("vllm", _bridged()), UNIT)
    finally:
        mp.undo()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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


def test_the_fresh_twin_passes_with_prefix_cache_hits(fresh):
    assert fresh.outcome is Outcome.PASS, fresh.message
    assert fresh.message.startswith("44 generated positions (llama) within logprob tolerance 0.0018 of the float64 reference")
    assert "prefix cache hits: llama request 4 256 tokens, request 5 128 tokens" in fresh.message
    assert "on conformance_vllm_engine.platform.FreshCpuPlatform, KV block 128" in fresh.message
    assert fresh.err_to_tol < 1


def test_an_out_of_tree_platform_with_its_own_worker_runs_the_engine_and_passes():
    """tests/plugins/vllm_good: `PlatformEnum.OOT` (CustomOps dispatch to forward_oot), device_name `cpu`, vLLM's
    CPUWorker subclassed to allocate without a sleep-mode pool. vLLM's own teardown then raises (it empties a torch
    accelerator's host cache on every platform but CpuPlatform): said in the message, not graded."""
    verdict = _verdict("good_cpu,good_cpu_kernels", PLUGINS / "vllm_good")
    assert verdict.outcome is Outcome.PASS, verdict.message
    assert "on conformance_vllm_good.platform.GoodCpuPlatform, KV block 128" in verdict.message
    assert "vLLM's engine shutdown raised after the requests finished (llama: RuntimeError: " in verdict.message
    assert "not graded)" in verdict.message


def test_a_platform_whose_device_name_is_no_torch_device_errors_saying_so():
    """tests/plugins/vllm_faults renames its device (`faults_cpu`): vLLM cannot build its devices, and the ERROR
    names the contract (not only torch's message)."""
    verdict = _verdict("faults_cpu,faults_layers", PLUGINS / "vllm_faults")
    assert verdict.outcome is Outcome.ERROR, verdict.message
    first = verdict.message.splitlines()[0]
    assert first.startswith("vLLM's engine raised on model llama: RuntimeError: "), first
    assert ("(the platform's device_name 'faults_cpu' is not a torch device type: vLLM builds an out-of-tree "
            "platform's devices as torch.device(f'{device_name}:{rank}'))") in first


def test_a_vendor_backend_that_drops_the_soft_cap_fails_on_gemma2():
    """tests/plugins/vllm_attention passes vLLM's CPU kernels everything but `logits_soft_cap`: Gemma-2's engine
    leaves the oracle, and no rerun changes it (the model path itself, as the attention family also shows)."""
    verdict = _verdict("acme_attn_cpu", PLUGINS / "vllm_attention", "gemma2")
    assert verdict.outcome is Outcome.FAIL, verdict.message
    assert verdict.message.startswith("the engine leaves the float64 reference (teacher-forced on the engine's tokens, "
                                      "logprob tolerance 0.0018): gemma2: request "), verdict.message
    assert "no feature changes it: the request diverges alone" in verdict.message
    assert "on conformance_vllm_attention.platform.AcmeAttnCpuPlatform" in verdict.message
