"""A conformance run killed from outside (SIGKILL: an OOM kill, `timeout -s KILL`; SIGTERM: `timeout`, a cancelled
CI job) leaves no process behind: not its kernel workers (even one stuck in a hanging kernel), not the zygote, not
xdist's workers or their kernel workers. Each run is a real `pytest --platform=broken_hangs` whose only check hangs,
so a kernel worker that outlived its controller would run (sleep) until killed by hand."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance import scratch_dirs
from conformance.run.worker import worker_environment
from conformance.run.zygote import Zygote
from harness_runner import harness_command, harness_env
from process_tree import MARKER_ENV, command, kill_all, marked, new_marker, survivors, tree

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the lifetime of processes is Linux's")

HANGING_CHECK = "rms_norm and float32 and ir_case and 128 and not 1280"
GONE_WITHIN_S = 20.0


def _wait_for_a_check_in_a_kernel_worker(run: subprocess.Popen, tmp: Path, output: Path) -> None:
    """Until a kernel worker's log says it runs a check (it then hangs in it); the logs live under the run's TMPDIR."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        for log in glob.glob(str(tmp / "**" / "conformance-worker-*.log"), recursive=True):
            try:
                if "--- conformance worker:" in Path(log).read_text(errors="replace"):
                    return
            except OSError:
                continue
        if run.poll() is not None:
            pytest.fail(f"the run ended (status {run.returncode}) before a check started: "
                        f"{output.read_text(errors='replace')[-3000:]}")
        time.sleep(0.25)
    pytest.fail(f"no kernel worker started a check within 240 s: {output.read_text(errors='replace')[-3000:]}")


# (xdist, signal, whom): the controller alone (an OOM kill, `kill PID`), or its whole process group as `timeout` and a
# cancelled CI job signal it (the controller and xdist's workers; the zygote and kernel workers have sessions of their own)
CASES = [(False, signal.SIGKILL, "controller"), (False, signal.SIGTERM, "controller"),
         (True, signal.SIGKILL, "controller"), (True, signal.SIGKILL, "group"), (True, signal.SIGTERM, "controller")]


@pytest.mark.parametrize(("xdist", "sig", "whom"), CASES,
                         ids=[f"{'xdist' if x else 'single'}-{s.name}-{w}" for x, s, w in CASES])
def test_a_killed_run_leaves_no_process(tmp_path, xdist, sig, whom):
    """Cost: about 12 s single, 15 s with -n 2 (the run's start-up to its first check, on 2 cores). Without xdist the
    stuck kernel worker outlived its controller; with xdist, a group kill left the forked workers running (the
    xdist workers, killed too, could not close them), and SIGTERM left the run's temp directory."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    marker = new_marker()
    env = harness_env("broken", **{MARKER_ENV: marker, "TMPDIR": str(tmp)})
    cmd = harness_command("broken_hangs", tmp_path / "out.json", "quick", "--conformance-timeout=600", "-k",
                          HANGING_CHECK, *(["-n", "2"] if xdist else []))
    output = tmp_path / "output.txt"
    with open(output, "wb") as out:
        run = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)   # a process group of its own, to signal as a whole
    known: set = set()
    try:
        _wait_for_a_check_in_a_kernel_worker(run, tmp, output)
        known = tree(run.pid) | marked(marker)
        assert len(known) >= (5 if xdist else 2), known   # xdist: controller, 2 workers, zygote, a kernel worker
        if whom == "group":
            os.killpg(run.pid, sig)
        else:
            run.send_signal(sig)
        run.wait(timeout=30)
        left = survivors(known, marker, GONE_WITHIN_S)
        assert not left, f"still running {GONE_WITHIN_S:g} s after the {whom} got {sig.name}: {left}"
        if sig == signal.SIGTERM:   # it could clean up: nothing of it is left in the temp directory either
            assert not list(tmp.glob("conformance-*")), list(tmp.iterdir())
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        kill_all(known, marker)


_CLIENT = """
import os, sys, time
from conformance.run.zygote import fork_worker
fd = os.open(os.devnull, os.O_WRONLY)
worker = fork_worker(sys.argv[1], ["timeit", "-n", "1", "import time; time.sleep(600)"], dict(os.environ), fd)
while worker.pid is None:
    time.sleep(0.05)
print(worker.pid, flush=True)
time.sleep(600)
"""


_CONTROLLER = """
import os, sys, time
from conformance.run.worker import worker_environment
from conformance.run.zygote import Zygote, fork_worker
zygote = Zygote.start(sys.argv[1], worker_environment(os.environ, 2))
fd = os.open(os.devnull, os.O_WRONLY)
worker = fork_worker(zygote.path, ["timeit", "-n", "1", "import time; time.sleep(600)"], dict(os.environ), fd)
while worker.pid is None:
    time.sleep(0.05)
print(worker.pid, flush=True)
time.sleep(600)
"""

def test_a_forked_worker_dies_with_its_client(tmp_path):
    """An xdist worker killed on its own (the controller lives on): the kernel worker the zygote forked for it, busy
    with something that never reads its stdin, is killed by the zygote when the client's connection closes.
    Cost: about 10 s (the zygote's imports)."""
    marker = new_marker()
    zygote = Zygote.start(str(tmp_path), {**worker_environment(os.environ, 2), MARKER_ENV: marker})
    client = subprocess.Popen([sys.executable, "-c", _CLIENT, zygote.path], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, MARKER_ENV: marker})
    worker = None
    try:
        worker = int(client.stdout.readline())
        known = tree(worker)
        assert known, "the forked worker is not running"
        client.kill()
        client.wait()
        left = survivors(known, None, GONE_WITHIN_S)
        assert not left, f"the forked worker outlived its client by {GONE_WITHIN_S:g} s: {left}"
        assert zygote.proc.poll() is None   # the zygote itself goes on serving the run's other workers
    finally:
        client.kill()
        if worker is not None:
            kill_all(tree(worker), None)
        zygote.kill()


def test_a_zygote_dies_with_its_controller_and_its_workers_with_it(tmp_path):
    """The controller killed with SIGKILL while its zygote has forked a worker: both end. Cost: about 10 s."""
    marker = new_marker()
    controller = subprocess.Popen([sys.executable, "-c", _CONTROLLER, str(tmp_path)], stdout=subprocess.PIPE,
                                  text=True, env={**os.environ, MARKER_ENV: marker})
    known: set = set()
    try:
        worker = int(controller.stdout.readline())
        known = tree(controller.pid)
        assert any(pid == worker for pid, _ in known), known
        controller.kill()
        controller.wait()
        left = survivors(known, marker, GONE_WITHIN_S)
        assert not left, f"still running {GONE_WITHIN_S:g} s after the controller was killed: {left}"
    finally:
        controller.kill()
        kill_all(known, marker)



def test_the_sigterm_handler_is_the_runs_own_and_is_given_back():
    """The handler a run installs (in-process, e.g. pytest.main) is removed at its end, and one that another
    party installed first is left alone."""
    from conformance import pytest_plugin

    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    pytest_plugin._end_on_sigterm(object())
    try:
        assert callable(signal.getsignal(signal.SIGTERM))
    finally:
        pytest_plugin._restore_sigterm()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL

    def theirs(signum, frame):
        pass

    signal.signal(signal.SIGTERM, theirs)
    try:
        pytest_plugin._end_on_sigterm(object())
        assert signal.getsignal(signal.SIGTERM) is theirs
        pytest_plugin._restore_sigterm()
        assert signal.getsignal(signal.SIGTERM) is theirs
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.engine
def test_a_run_killed_while_vllms_engine_runs_leaves_no_engine(tmp_path):
    """`--platform=vllm`, killed (SIGKILL) while the engine family's engine process (vLLM's engine core in it, and the
    helpers vLLM and inductor start from it) runs a job: none of it outlives the run. Cost: about 25 s."""
    pytest.importorskip("vllm")
    marker = new_marker()
    env = harness_env(None, **{MARKER_ENV: marker, "TMPDIR": str(tmp_path)})
    cmd = harness_command("vllm", tmp_path / "out.json", "standard", "-k", "engine and float32")
    output = tmp_path / "output.txt"
    with open(output, "wb") as out:
        run = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    known: set = set()
    try:
        deadline = time.monotonic() + 240
        while not any("conformance.vllm.engine_runner" in command(pid) for pid, _ in marked(marker)):
            assert run.poll() is None, f"the run ended before its engine started: {output.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no engine process within 240 s: {output.read_text()[-3000:]}"
            time.sleep(0.2)
        time.sleep(3)   # into vLLM's import and the job
        known = tree(run.pid) | marked(marker)
        run.kill()
        run.wait()
        left = survivors(known, marker, GONE_WITHIN_S)
        assert not left, f"still running {GONE_WITHIN_S:g} s after the run was killed: {left}"
        # what the kernel worker made (the engine's directory, vLLM's model config) is inside the run's directory,
        # named for the killed controller: the next run's start removes it (before, each stayed in /tmp for good)
        ours = sorted(p.name for p in tmp_path.glob("conformance-*"))
        assert len(ours) == 1 and ours[0].startswith(f"conformance-run-{run.pid}-"), ours
        inside = {p.name.split("-")[1] for p in (tmp_path / ours[0]).glob("conformance-*-*") if p.is_dir()}
        assert "engine" in inside, sorted(p.name for p in (tmp_path / ours[0]).iterdir())
        assert scratch_dirs.remove_orphans(str(tmp_path)) == ours and not list(tmp_path.glob("conformance-*"))
    finally:
        if run.poll() is None:
            run.kill()
        kill_all(known, marker)
