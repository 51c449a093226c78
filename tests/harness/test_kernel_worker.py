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
