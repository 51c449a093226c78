"""`conformance repro` by default: the check runs in a child process, so a crash of the implementation is
reported like the harness reports it (one line naming the signal and what was running, then the
crashed process's Python and native stacks) instead of the shell's bare exit status 139.

The child is `python -m conformance repro ... --in-process` with the worker's crash instruments
(conformance.results.running_note, faulthandler's file, torch's native stacks on its stderr); its stdout
is the terminal's, its stderr is relayed once it ends.
"""

from __future__ import annotations

import os
import subprocess
import sys

from conformance.results import running_note
from conformance import scratch_dirs
from conformance.run.crash_report import NATIVE_STACK_HEADER, crash_message
from conformance.exit_codes import ExitCode
from conformance.run.worker import FAULT_FILE_ENV


def supervise(child_argv: list[str]) -> int:
    """Run `python -m conformance <child_argv>`; its exit status, or FAILED with the CRASH report when it died."""
    with scratch_dirs.directory("repro") as tmp:
        paths = {name: os.path.join(tmp, name) for name in ("stderr.log", "faulthandler.txt", "running.json")}
        env = dict(os.environ, **{FAULT_FILE_ENV: paths["faulthandler.txt"],
                                  running_note.NOTE_ENV: paths["running.json"]})
        with open(paths["stderr.log"], "wb") as err:
            rc = subprocess.call([sys.executable, "-m", "conformance", *child_argv], stderr=err, env=env)
        stderr_text = _read(paths["stderr.log"])
        if rc >= 0:
            sys.stderr.write(stderr_text)
            return rc
        first_stack = NATIVE_STACK_HEADER.search(stderr_text)
        sys.stderr.write(stderr_text[: first_stack.start()] if first_stack else "")
        sys.stderr.flush()
        message = crash_message(rc, running_note.read(paths["running.json"]), _read(paths["faulthandler.txt"]),
                                stderr_text, "the process running the check")
        print(f"CRASH  {message}", flush=True)
        return ExitCode.FAILED


def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode(errors="replace")
    except OSError:
        return ""
