"""The collective family through the whole harness: `pytest --platform=vllm` with tests/plugins/vllm_collective's
`collective_wrong_dim` found by its entry point and its communicator built in the kernel worker's rank processes.
Its own faulty all_gather FAILs as the plugin's code, its own reduce_scatter PASSes, the destroy it inherits is
vLLM's (upstream), and the origins and repro lines reach the results file."""

from __future__ import annotations

import importlib.util

import pytest

from harness_runner import PLUGINS, run_harness

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed here (bash scripts/setup.sh --vllm installs it)")


def test_a_vendor_communicator_through_the_harness(tmp_path):
    run = run_harness(tmp_path, "vllm", "-k", "collective and methods and (all_gather or reduce_scatter or destroy) "
                      "and not gatherv and not scatterv and tp", dist=PLUGINS / "vllm_collective", level="standard",
                      timeout=600, env={"VLLM_PLUGINS": "collective_wrong_dim"})
    assert run.doc is not None and run.doc["run"]["complete"], run.output[-3000:]
    by_op = {r["op"]: r for r in run.where(check="collective")}
    assert set(by_op) >= {"all_gather", "destroy"}, run.output[-3000:]
    gather = by_op["all_gather"]
    assert gather["outcome"] == "FAIL", gather["message"]
    assert "all_gather(dim=-1) on (3, 4) float32: rank 0: returned shape (6, 4), expected (3, 8)" in gather["message"]
    assert gather["origin"] == {"distribution": "conformance-vllm-collective", "version": "0.1.0", "upstream": False,
                                "code": "conformance_vllm_collective.communicators.WrongDimCommunicator.all_gather"}
    assert "--check collective.methods --op all_gather --provider tp:0 --dtype float32 --case world=2" in gather["repro"]
    destroy = by_op["destroy"]
    assert destroy["outcome"] == "PASS"
    assert destroy["origin"]["code"].endswith("base_device_communicator.DeviceCommunicatorBase.destroy")
    assert destroy["origin"]["upstream"] is True        # vLLM's own code under a vendor's plugin
    rs = [r for r in run.where(check="collective", op="reduce_scatter")]
    assert rs and {r["outcome"] for r in rs} == {"PASS"}
    assert run.returncode != 0          # the plugin's own FAIL decides the verdict
