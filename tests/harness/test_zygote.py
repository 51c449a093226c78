"""Kernel workers forked by the run's zygote (conformance.run.zygote): they run checks like a worker started from
scratch, their exit status (a kill, a signal) comes back through the zygote, and a client that finds no zygote
starts its worker from scratch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from conformance.collect.units import DEFAULT_SEED, Unit
from conformance.run.worker import KernelWorker, WorkerStartError, worker_environment
from conformance.run.zygote import ZYGOTE_ENV, ForkedProcess, Zygote
from harness_runner import harness_env, kernel_worker_probe, run_harness

UNIT = Unit("dispatch", "defaults", "rms_norm", "cpp")


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def zygote(tmp_path):
    z = Zygote.start(str(tmp_path), worker_environment(os.environ, 2))
    yield z
    z.close()


def test_forked_workers_run_checks_and_their_kill_comes_back_as_the_exit_status(zygote):
    workers = [KernelWorker("cpu", DEFAULT_SEED, "quick", zygote=zygote.path) for _ in range(2)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            reply = worker.run(UNIT, timeout=120)
            assert reply["outcome"] == "PASS", reply
            assert isinstance(worker.proc, ForkedProcess) and _parent_of(worker.proc.pid) == zygote.proc.pid
        assert workers[0].proc.pid != workers[1].proc.pid
        proc = workers[0].proc
        workers[0].stop()   # as after a TIMEOUT: the worker's process group is killed
        assert proc.returncode == -signal.SIGKILL and _gone(proc.pid)
        assert workers[0].run(UNIT, timeout=120)["outcome"] == "PASS"   # the next check: a fresh fork
        assert workers[0].starts == 2 and isinstance(workers[0].proc, ForkedProcess)
    finally:
        for worker in workers:
            worker.close()
    zygote.close()
    assert zygote.proc.returncode == 0


def test_a_worker_that_dies_of_a_signal_is_a_crash_naming_it(zygote):
    worker = KernelWorker("cpu", DEFAULT_SEED, "quick", zygote=zygote.path)
    try:
        assert worker.run(UNIT, timeout=120)["outcome"] == "PASS"
        os.kill(worker.proc.pid, signal.SIGSEGV)
        deadline = time.monotonic() + 30
        while worker.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert worker.proc.returncode == -signal.SIGSEGV
        reply = worker.run(UNIT, timeout=120)   # a dead worker is replaced before the next check
        assert reply["outcome"] == "PASS" and worker.starts == 2
    finally:
        worker.close()


def test_without_a_zygote_the_worker_starts_from_scratch(tmp_path, zygote):
    zygote.close()   # ended: its socket no longer answers
    for path in (zygote.path, str(tmp_path / "never-started.sock")):
        worker = KernelWorker("cpu", DEFAULT_SEED, "quick", zygote=path)
        try:
            assert worker.run(UNIT, timeout=120)["outcome"] == "PASS"
            assert isinstance(worker.proc, subprocess.Popen)
        finally:
            worker.close()


def test_a_single_process_run_forks_its_kernel_workers_from_the_zygote_its_caller_names(tmp_path):
    """CONFORMANCE_ZYGOTE: a zygote its caller keeps across runs (the tests' warm_python template is one); the
    worker takes the run's working directory. A fresh controller here (WARM_ENV=0), the harness's own zygote."""
    z = Zygote.start(str(tmp_path), worker_environment(harness_env(), 1))
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        probe, seen = kernel_worker_probe(run_dir)
        run = run_harness(run_dir, "cpu", "-p", probe, "-k", "numerics and rms_norm and float32 and ir_case",
                          env={ZYGOTE_ENV: z.path, "WARM_ENV": "0"})
        assert run.returncode == 0, run.output[-2000:]
        assert json.loads(seen.read_text()) == {"kind": "ForkedProcess", "parent": z.proc.pid, "cwd": str(run_dir)}
    finally:
        z.close()


def test_a_crash_under_xdist_reads_as_in_one_process(tmp_path):
    """-n 2 forks the kernel workers from the zygote: the CRASH results (signal, stacks) are those of one process,
    whose workers start from scratch."""
    select = ["-k", "float32 and ir_case and 128 and not 1280"]
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    single = run_harness(tmp_path / "one", "broken_segfault", *select, dist="broken")
    spread = run_harness(tmp_path / "two", "broken_segfault", "-n", "2", *select, dist="broken")
    crashes = [r for r in spread.results if r["outcome"] == "CRASH"]
    assert crashes and all("died of signal SIGSEGV (11)" in r["message"].splitlines()[0] for r in crashes), \
        spread.output[-3000:]
    key = lambda r: (r["nodeid"], r["outcome"], r["message"])  # noqa: E731
    assert sorted(map(key, spread.results)) == sorted(map(key, single.results))


def test_no_zygote_where_import_torch_would_load_a_device_extension(monkeypatch):
    """An extension in entry-point group torch.backends is imported with torch, in the zygote, and may open its
    device there: a run with one starts every worker from scratch, unless the autoload is off."""
    import importlib.metadata

    real = importlib.metadata.entry_points
    assert Zygote.can_fork_workers({}) == (not real(group="torch.backends"))
    extension = importlib.metadata.EntryPoint("npu", "torch_npu:_autoload", "torch.backends")
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group=None: [extension] if group == "torch.backends" else real(group=group))
    assert not Zygote.can_fork_workers({})
    assert Zygote.can_fork_workers({"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})


@pytest.mark.timeout(120)
def test_a_zygote_that_never_forks_costs_the_start_limit_not_a_hang(tmp_path):
    """A zygote stuck before forking (here: a socket that listens and never answers) gives the usual start error
    once the start limit is over; stopping the worker does not wait for a pid that never comes."""
    import socket

    path = str(tmp_path / "stuck.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stuck:
        stuck.bind(path)
        stuck.listen(1)
        worker = KernelWorker("cpu", DEFAULT_SEED, "quick", start_timeout=1.0, zygote=path)
        start = time.monotonic()
        with pytest.raises(WorkerStartError, match="did not start: no ready message within 1 s"):
            worker.run(UNIT, timeout=120)
        assert worker.proc is None and time.monotonic() - start < 30
        worker.close()
