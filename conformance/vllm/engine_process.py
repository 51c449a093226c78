"""The `engine` family's handle on its engine process (conformance/vllm/engine_runner.py): start it, hand it jobs,
and turn its death or silence into one line the verdict can carry (exit status or signal, its last output).

The process inherits this one's environment, so vLLM resolves the same platform there (the same `VLLM_PLUGINS`,
the same installed plugins) and runs it as a vLLM deployment would; the harness's own per-process files (the
running note, the fault file) are not passed on. It is killed with its parent (PR_SET_PDEATHSIG, which the engine
runner sets as it starts), so a kernel worker killed for a timeout, or with its whole run, leaves no engine behind.
The signal follows the thread that started the process: start it from a thread that outlives it (the kernel
worker's main thread, which runs the checks). vLLM's engine core runs inside it (no EngineCore process); what it
starts itself (vLLM's model-registry probe, inductor's compiler) is short-lived and ends on its own
(tests/harness/test_killed_runs.py kills a run mid-job and finds nothing left).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from conformance.vllm.engine_runner import PARENT_ENV

START_TIMEOUT_S = 120.0
LOG_TAIL_LINES = 12
# vLLM's log prefix "(EngineCore pid=123) ERROR 11-27 20:31:15 [core.py:42] " and torch's "[rank0]: ": a process id
# and a time that would make the message differ from run to run; the level and the text are kept
_LOG_PREFIX = re.compile(r"^(\[rank\d+\]:\s*)?(\(\w+ pid=\d+\)\s*)?(?:(\w+) \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] )?")
_NOT_PASSED_ON = ("CONFORMANCE_RUNNING_NOTE", "CONFORMANCE_FAULT_FILE")


class EngineFailed(Exception):
    """The engine process died or went silent; `crashed` tells which (a CRASH or a TIMEOUT result)."""

    def __init__(self, message: str, crashed: bool):
        super().__init__(message)
        self.crashed = crashed


class EngineProcess:
    """One engine process in `workdir` (its log goes to workdir/engine.log); use as a context manager. `command`
    replaces the engine runner (tests hand it processes that die or hang)."""

    def __init__(self, workdir: Path, command: list[str] | None = None, start_timeout: float = START_TIMEOUT_S):
        self.start_timeout = start_timeout
        self.command = command or [sys.executable, "-m", "conformance.vllm.engine_runner"]
        self.workdir = Path(workdir)
        self.log_path = self.workdir / "engine.log"
        self.proc: subprocess.Popen | None = None
        self.jobs = 0

    def __enter__(self) -> EngineProcess:
        env = {k: v for k, v in os.environ.items() if k not in _NOT_PASSED_ON}
        env[PARENT_ENV] = str(os.getpid())
        self._log = open(self.log_path, "wb")   # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env)
        self._expect("ready", self.start_timeout, "starting (importing vLLM)")
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def run(self, runs: list[dict], timeout: float) -> dict:
        """Run `runs` (engine_runner's run dicts) as one job; its results document."""
        self.jobs += 1
        out = self.workdir / f"job{self.jobs}.json"
        try:
            self.proc.stdin.write((json.dumps({"runs": runs, "out": str(out)}) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            pass   # it died: _expect says how
        self._expect("done", timeout, f"running {', '.join(r['name'] for r in runs)}")
        return json.loads(out.read_text())

    def _expect(self, word: str, timeout: float, doing: str) -> None:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        buffered = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.proc.kill()
                self.proc.wait()
                raise EngineFailed(f"the engine process was silent for {timeout:g} s while {doing} and was killed; "
                                   f"its last output: {self.tail()}", crashed=False)
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    rc = self.proc.wait()
                    raise EngineFailed(f"the engine process {describe_exit(rc)} while {doing}; its last output: "
                                       f"{self.tail()}", crashed=True)
                buffered += chunk
                if f"{word}\n".encode() in buffered:
                    return

    def tail(self) -> str:
        """The engine log's last lines that are not vLLM's routine warnings, joined by ' | '."""
        self._log.flush()
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        kept = [_LOG_PREFIX.sub(lambda m: f"{m.group(3)} " if m.group(3) else "", ln).strip() for ln in lines
                if ln.strip() and "WARNING" not in ln and "it/s]" not in ln]
        return " | ".join(kept[-LOG_TAIL_LINES:]) or "(nothing)"


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"was killed by {name}"
    return f"exited with status {rc}"
