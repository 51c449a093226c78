"""The kernel worker: a persistent subprocess that runs checks of the platform's code.

The pytest process never runs vendor kernels itself: it sends a unit (a small dict) down a pipe,
the worker rebuilds inputs from (op, case, dtype, seed) and answers with a verdict. A worker that
dies (segfault, abort) is reported as CRASH, one that overruns the per-check timeout is killed and
reported as TIMEOUT; either way the next check gets a fresh worker.

Protocol: length-prefixed pickles on the worker's stdin/stdout; the worker moves its own fd 1 onto
fd 2 at start so kernels that print cannot corrupt the stream. Each worker has three files of its
own: fd 2 goes to a log (where torch's fatal-signal handler prints native stacks), faulthandler
writes Python stacks to a second, and the running note (conformance.results.running_note) says what runs;
a CRASH message is built from those (conformance.run.crash_report), never from another worker's output.

A worker dies with the process that started it (Linux: PR_SET_PDEATHSIG, see conformance.run.zygote), whatever
kills that one; one forked by the zygote also dies when its client's connection closes.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any

from conformance.results import running_note
from conformance.run.crash_report import crash_message, describe_exit, running_line  # noqa: F401 - describe_exit kept here
from conformance.run.zygote import PARENT_ENV, ForkedProcess, die_with_parent, fork_worker, parent_from_environment
from conformance.results.result import Outcome
from conformance.collect.units import Unit

FAULT_FILE_ENV = "CONFORMANCE_FAULT_FILE"

_HEADER = struct.Struct("!I")
# first lines of crash reports in a worker's log: faulthandler's, and the handlers some kernel
# libraries install (vLLM's CPU library prints the second)
CRASH_REPORT_MARKERS = ("Fatal Python error", "Segfault encountered")


def _send(stream, obj: Any) -> None:
    data = pickle.dumps(obj)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _recv_blocking(stream) -> Any | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (n,) = _HEADER.unpack(header)
    data = stream.read(n)
    return pickle.loads(data) if len(data) == n else None


# ----- worker side ---------------------------------------------------------------------------------
def serve(platform: str, seed: int, level: str) -> int:
    import faulthandler

    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    enable_crash_stacks(faulthandler)
    running_note.open_from_environment()
    proto_in = sys.stdin.buffer
    if os.environ.get("CONFORMANCE_WORKER_THREADS"):
        import torch

        torch.set_num_threads(int(os.environ["CONFORMANCE_WORKER_THREADS"]))
    try:
        from conformance.checks import CheckContext, registry, run_unit
        from conformance.collect.inventory import activate

        inventory = activate(platform)
        from reference_impl.utils import enable_amx_tiles

        # as in any engine process: otherwise an AMX kernel's outcome would depend on whether an earlier check in
        # this worker happened to run a bf16 GEMM (which asks for the AMX state)
        enable_amx_tiles()
        ctx = CheckContext(platform, inventory.platform, seed=seed, level=level)
        registry()   # import every check module now: the first check's time limit is not for imports
        import torch._dynamo  # noqa: F401 - nor for Dynamo's (2 s), which the check modules import where used
        prepare_reference_kernels(inventory)
        # what is imported now lives as long as the worker: out of the cyclic collector's sight, so that its
        # collections (every few hundred allocations of Dynamo and fake-tensor objects) stop traversing it
        gc.freeze()
    except Exception as exc:  # noqa: BLE001 - reported to the parent as one line
        _send(proto_out, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    _send(proto_out, {"ready": True, "pid": os.getpid()})
    while True:
        request = _recv_blocking(proto_in)
        if request is None:   # the parent closed the pipe: every result is sent, nothing is left to save
            _close_kept_processes(ctx.platform)
            sys.stderr.flush()
            os._exit(0)   # skips the interpreter's teardown of torch (about 1 s the parent would wait for)
        unit = Unit.from_dict(request["unit"])
        print(f"--- conformance worker: {unit.family}.{unit.check} {unit.id}", file=sys.stderr, flush=True)
        running_note.start_unit(unit.to_dict())
        verdict, duration = run_unit(ctx, unit)
        _send(proto_out, reply_of(verdict, duration))


def _close_kept_processes(platform) -> None:
    """End what the platform keeps running from unit to unit (the bridge's vLLM engine processes) the way it ends them
    itself: `os._exit` runs no finalizer, and an engine killed with this process (PR_SET_PDEATHSIG) leaves what only
    its clean exit removes."""
    close = getattr(platform, "conformance_close", None)
    if close is None:
        return
    try:
        close()
    except Exception as exc:  # noqa: BLE001 - every result is sent; the log says what did not close
        print(f"--- conformance worker: closing the platform's processes raised {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)


def reply_of(verdict, duration: float) -> dict[str, Any]:
    """What the worker sends back for one unit: every field of the check's Verdict (the outcome by its value), and the
    unit's duration. Every field, so that what a check observed (its origin: whose code the outcome is about) reaches
    the results file instead of stopping here."""
    reply = {f.name: getattr(verdict, f.name) for f in dataclasses.fields(verdict)}
    reply["outcome"] = verdict.outcome.value
    reply["duration_s"] = duration
    return reply


_FAULT_FILE = []   # faulthandler writes through this file object: it must stay open for the process's life


def enable_crash_stacks(faulthandler) -> None:
    """On a fatal signal: torch's handler prints every thread's native stack to stderr (this process's own log),
    and faulthandler, which runs first and then hands over to it, writes the Python stacks to the file the
    parent named (or stderr)."""
    try:
        import torch

        torch._C._set_print_stack_traces_on_fatal_signal(True)
    except (ImportError, AttributeError):   # an older torch: Python stacks only
        pass
    path = os.environ.get(FAULT_FILE_ENV)
    if path:
        _FAULT_FILE.append(open(path, "w"))  # noqa: SIM115 - kept open on purpose
        faulthandler.enable(file=_FAULT_FILE[0], all_threads=True)
    else:
        faulthandler.enable(all_threads=True)


def prepare_reference_kernels(inventory) -> None:
    """Build the reference C++ kernels now when the platform brings the `cpp` provider, so a cold build
    (about two minutes on a loaded two-core machine) counts against the worker's start-up limit, not
    against the time limit of whichever check happens to call a kernel first. A build failure is left
    to the checks, which report it where the kernel is called."""
    if not any("cpp" in providers for providers in inventory.ir_providers.values()):
        return
    from reference_impl.kernels import _cpp_build

    if _cpp_build.toolchain_problem() is None:
        try:
            _cpp_build.load()
        except Exception:  # noqa: BLE001 - reported by the first check that calls a kernel
            pass


# ----- parent side ---------------------------------------------------------------------------------
def worker_environment(base, xdist_workers: int) -> dict[str, str]:
    """The environment of a kernel worker (and of the zygote that forks them, which must import under the same
    settings) when `xdist_workers` processes each run one."""
    env = dict(base)
    env.setdefault("PYTHONFAULTHANDLER", "1")   # until the worker names its own file: a crash at import
    # one graph compiles at a time here: Inductor's pool of compile subprocesses would import torch once
    # more per worker and make the next compile wait for the pool to start (2.5 s against 0.06 s)
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    if xdist_workers > 1:   # share the cores between the xdist workers' kernel workers
        threads = str(max(1, (os.cpu_count() or 1) // xdist_workers))
        env.setdefault("OMP_NUM_THREADS", threads)
        env.setdefault("CONFORMANCE_WORKER_THREADS", threads)
    return env


class WorkerStartError(RuntimeError):
    """The worker could not activate the platform."""


class KernelWorker:
    """Owns one worker process; `run(unit, timeout)` answers a result dict whatever the worker does."""

    def __init__(self, platform: str, seed: int, level: str, start_timeout: float = 300.0, zygote: str | None = None,
                 directory: str | None = None):
        self.platform, self.seed, self.level = platform, seed, level
        self.directory = directory   # where its log, fault file and running note go (None: the temp directory)
        self.start_timeout = start_timeout
        self.zygote = zygote   # socket of the run's zygote (conformance.run.zygote), which forks workers ready-imported
        self.proc: subprocess.Popen | ForkedProcess | None = None
        self.log_path: str | None = None
        self.fault_path: str | None = None
        self.note_path: str | None = None
        self.starts = 0
        self.ready = False

    def start(self) -> None:
        """Launch the worker without waiting for it to be ready: its start-up (imports, platform, kernels: about
        4.5 s) then overlaps with the caller's own work; the first `run` waits for it."""
        if self.proc is None:
            self._launch()

    def _launch(self) -> None:
        self._remove_log()   # the previous worker's files (what they said is already in a CRASH message)
        fd, self.log_path = tempfile.mkstemp(prefix="conformance-worker-", suffix=".log", dir=self.directory)
        self.fault_path = _empty_file("conformance-worker-", ".faulthandler", self.directory)
        self.note_path = _empty_file("conformance-worker-", ".running.json", self.directory)
        env = worker_environment(os.environ, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
        env[FAULT_FILE_ENV] = self.fault_path
        env[running_note.NOTE_ENV] = self.note_path
        module_args = ["conformance.run.worker", "--platform", self.platform, "--seed", str(self.seed),
                       "--level", self.level]   # what `python -m` runs
        self.proc = None
        if self.zygote:
            try:
                self.proc = fork_worker(self.zygote, module_args, env, fd)
            except OSError:   # the zygote has ended (or never listened): start one from scratch
                self.proc = None
        if self.proc is None:
            env[PARENT_ENV] = str(os.getpid())   # it dies with this process (zygote.die_with_parent)
            self.proc = subprocess.Popen([sys.executable, "-m", *module_args], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=fd, env=env, start_new_session=True)
        os.close(fd)
        self.starts += 1
        self.ready = False

    def _await_ready(self) -> None:
        try:
            reply = self._read(self.start_timeout)
        except TimeoutError:
            reply = {"error": f"no ready message within {self.start_timeout:g} s"}
        if not isinstance(reply, dict) or not reply.get("ready"):
            detail = reply.get("error") if isinstance(reply, dict) else self._log_tail(0)
            self.stop()
            raise WorkerStartError(f"kernel worker for platform '{self.platform}' did not start: {detail}")
        self.ready = True

    def _read(self, timeout: float) -> Any | None:
        """One message, or None on EOF; raises TimeoutError when nothing arrives in `timeout` s."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        buf = b""
        length = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)   # one request in flight: no bytes of a later message follow
            if not chunk:
                return None
            buf += chunk
            if length is None and len(buf) >= _HEADER.size:
                (length,) = _HEADER.unpack(buf[:_HEADER.size])
            if length is not None and len(buf) >= _HEADER.size + length:
                return pickle.loads(buf[_HEADER.size:_HEADER.size + length])

    def _log_tail(self, offset: int, limit: int = 2500) -> str:
        text = "\n".join(ln for ln in self._log_text(offset).splitlines() if not ln.startswith("--- conformance worker:"))
        # a crash report (faulthandler's, or a library's own handler's) starts with the crashing frames;
        # the stacks of other threads that may follow it are cut, not the frames that say where it died
        starts = [i for i in (text.find(m) for m in CRASH_REPORT_MARKERS) if i >= 0]
        if starts:
            return text[min(starts):min(starts) + limit].strip()
        return text[-limit:].strip()

    def _log_text(self, offset: int) -> str:
        return _read_text(self.log_path, offset)

    def _log_size(self) -> int:
        try:
            return os.path.getsize(self.log_path) if self.log_path else 0
        except OSError:
            return 0

    def run(self, unit: Unit, timeout: float) -> dict[str, Any]:
        if self.proc is None or (self.ready and self.proc.poll() is not None):   # none yet, or the last one died
            self.stop()
            self._launch()
        if not self.ready:   # launched here or by start(): wait for its ready message
            self._await_ready()
        assert self.proc is not None and self.proc.stdin is not None
        offset = self._log_size()
        start = time.monotonic()
        try:
            _send(self.proc.stdin, {"unit": unit.to_dict()})
            reply = self._read(timeout)
        except TimeoutError:
            note = running_note.read(self.note_path)
            self.stop()
            return {"outcome": Outcome.TIMEOUT.value, "duration_s": time.monotonic() - start, "draw": note.get("draw"),
                    "message": f"no result within the per-check limit of {timeout:g} s "
                               f"(--conformance-timeout), {running_line(note)}; the worker was killed and restarted"}
        except (BrokenPipeError, OSError):
            reply = None
        if reply is None:
            rc = self.proc.wait() if self.proc else None
            self.proc = None
            note = running_note.read(self.note_path)
            message = crash_message(rc, note, _read_text(self.fault_path, 0), self._log_text(offset),
                                    "the worker process running this check")
            first, _, rest = message.partition("\n")
            message = f"{first} A new worker runs the next check." + (f"\n{rest}" if rest else "")
            return {"outcome": Outcome.CRASH.value, "duration_s": time.monotonic() - start, "message": message,
                    "draw": note.get("draw")}
        return reply

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            if proc.pid is None:   # a forked worker its zygote has not forked yet: abandoned (ForkedProcess.kill)
                proc.kill()
            else:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass

    def kill(self) -> None:
        """End the worker now (its process group) and remove its files: for a run that is itself being ended."""
        self.stop()
        self._remove_log()

    def close(self) -> None:
        """End the worker: let a ready one exit on its own (it has sent every result), kill one still starting."""
        if self.proc is not None and self.ready and self.proc.poll() is None and self.proc.stdin:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.stop()
        self._remove_log()

    def _remove_log(self) -> None:
        for name in ("log_path", "fault_path", "note_path"):
            path = getattr(self, name)
            if path:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                setattr(self, name, None)


def _empty_file(prefix: str, suffix: str, directory: str | None = None) -> str:
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
    os.close(fd)
    return path


def _read_text(path: str | None, offset: int) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    die_with_parent(parent_from_environment())   # first: a worker whose starter is gone has nobody to answer
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--platform", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--level", required=True)
    args = parser.parse_args(argv)
    return serve(args.platform, args.seed, args.level)


if __name__ == "__main__":
    sys.exit(main())
