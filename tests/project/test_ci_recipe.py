"""The vendor CI recipe (examples/ci/conformance.sh) end to end on the demo plugin: two shards,
merge, reports, and the gate on verdict, waivers and baseline, failure paths included.

The recipe calls `python -m conformance merge/compare/report` and `--conformance-shard`; where this
checkout has no `conformance merge` the test is skipped and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness_runner import PLUGINS

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "ci" / "conformance.sh"
WORKFLOW = ROOT / "examples" / "ci" / "github-conformance.yml"
# Cheap demo checks (numerics of rms_norm, and the NOT_IMPLEMENTED coverage results) keep two shards fast.
SELECTION = ("-k", "(test_numerics and rms_norm-demo and not fused) or test_coverage")


def _merge_available() -> bool:
    proc = subprocess.run([sys.executable, "-m", "conformance", "merge", "--help"], capture_output=True, text=True)
    return proc.returncode == 0


needs_merge = pytest.mark.skipif(not _merge_available(), reason=(
    "`python -m conformance merge` is not available in this checkout; the CI recipe needs merge, compare, "
    "the HTML report and --conformance-shard"))


def _recipe(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in ("REFERENCE_IMPL_PLUGINS", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "BASELINE", "WAIVERS")}
    base.update(PYTHON=sys.executable, PLATFORM="demo", LEVEL="quick", SHARDS="2", OUT_DIR=str(tmp_path / "out"),
                PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS / "demo"), os.environ.get("PYTHONPATH")])))
    base.update(env)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env=base, capture_output=True, text=True,
                          timeout=600)


def _results(path: Path) -> list[dict]:
    return json.loads(path.read_text())["results"]


@needs_merge
def test_two_shards_merge_into_a_passing_gate_and_a_baseline_regression_fails_it(tmp_path):
    run = _recipe(tmp_path, "all", *SELECTION)
    out = tmp_path / "out"
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "gate PASSED" in run.stderr
    shards = [_results(out / f"shard-{i}-of-2.json") for i in (1, 2)]
    assert all(shards), "a shard ran nothing: the selection is too narrow to test sharding"
    merged = json.loads((out / "all.json").read_text())
    assert merged["verdict"] == "CONFORMANT"
    assert sorted(r["nodeid"] for r in merged["results"]) == sorted(r["nodeid"] for s in shards for r in s)
    assert {r["provider"] for r in merged["results"]} >= {"demo"}
    html = (out / "report.html").read_text()
    assert "<html" in html.lower() and "demo" in html
    assert (out / "report.md").read_text().strip()

    # A baseline in which something now NOT_IMPLEMENTED had passed: a regression fails the gate.
    baseline = json.loads((out / "all.json").read_text())
    flipped = next(r for r in baseline["results"] if r["outcome"] == "NOT_IMPLEMENTED")
    flipped["outcome"] = "PASS"
    (tmp_path / "baseline.json").write_text(json.dumps(baseline))
    gate = _recipe(tmp_path, "gate", BASELINE=str(tmp_path / "baseline.json"))
    assert gate.returncode == 1, gate.stdout[-2000:] + gate.stderr[-2000:]
    assert "gate FAILED" in gate.stderr
    assert flipped["op"] in (out / "compare.md").read_text()

    # A missing shard is reported, not merged: nothing can be judged.
    (out / "shard-2-of-2.json").unlink()
    missing = _recipe(tmp_path, "gate")
    assert missing.returncode == 4, missing.stdout[-2000:] + missing.stderr[-2000:]
    assert "could not be merged" in missing.stderr


@needs_merge
def test_waivers_reach_the_shards_and_a_stale_waiver_fails_the_gate(tmp_path):
    waivers = tmp_path / "waivers.toml"
    waivers.write_text('[[waiver]]\ncheck = "numerics.ir_case"\nop = "rms_norm"\nprovider = "demo"\n'
                       'dtype = "float32"\ncase = "tokens=1,hidden=128"\n'
                       'reason = "stale on purpose: this case passes"\n')
    run = _recipe(tmp_path, "all", "-k", "test_numerics and rms_norm-demo and not fused",
                  SHARDS="1", WAIVERS=str(waivers))
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    merged = json.loads((tmp_path / "out" / "all.json").read_text())
    xpass = [r for r in merged["results"] if r["outcome"] == "XPASS"]
    assert [(r["op"], r["provider"], r["dtype"], r["case"]) for r in xpass] == [
        ("rms_norm", "demo", "float32", "tokens=1,hidden=128")]
    assert merged["verdict"] == "NOT_CONFORMANT"

    waivers.write_text('[[waiver]]\nop = "rms_norm"\n')  # no reason: the shard cannot run
    broken = _recipe(tmp_path, "shard", "1", "1", WAIVERS=str(waivers))
    assert broken.returncode == 4
    assert "did not complete" in broken.stderr


def test_recipe_usage_errors_and_the_workflow_calls_the_recipe(tmp_path):
    assert _recipe(tmp_path, "nonsense").returncode == 4
    assert _recipe(tmp_path, "shard", "1").returncode == 4
    empty = _recipe(tmp_path, "gate")
    assert empty.returncode == 4 and "no shard results" in empty.stderr
    text = WORKFLOW.read_text()
    for step in ("ci/conformance.sh install", "ci/conformance.sh shard ${{ matrix.shard }} ${{ strategy.job-total }}",
                 "ci/conformance.sh gate", "actions/upload-artifact", "report.html"):
        assert step in text, step
