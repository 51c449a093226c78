"""The engine process the bridge's platform lends the `engine` family, kept from one unit to the next.

A unit of the family is one model (conformance/checks/engine/): a standard run has six of them. A fresh engine process
per unit would pay vLLM's import, and its first engine's slower start, six times; the session keeps one process
(conformance/vllm/engine_process.py) for the units of one platform object in one process (a kernel worker), so the
import is paid once, as when one process ran every model of a dtype. Each run is still an engine of its own (a new
`LLM`, shut down after its requests). The process is given up, and the next unit starts a fresh one, after a job in
which an engine raised (vLLM's state after a failed start is not trusted for the next model), when it died or went
silent (`EngineFailed`), or when anything else raised while a unit held it. It dies with the process that started it
(engine_runner's PR_SET_PDEATHSIG, and the end of its stdin), and is closed when the platform object is collected.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from conformance import scratch_dirs


class EngineJobs:
    """What a unit holds: `run(runs, timeout)`, the engine process's results document for one job; it notes whether
    an engine raised, so the session gives that process up afterwards."""

    def __init__(self, process):
        self.process = process
        self.engine_raised = False

    def run(self, runs: list[dict], timeout: float) -> dict:
        doc = self.process.run(runs, timeout)
        self.engine_raised = self.engine_raised or any("error" in run for run in doc.get("runs", []))
        return doc

    def tail(self) -> str:
        return self.process.tail()


class EngineSession:
    """One kept engine process; calling the session (`with session(workdir) as jobs:`) lends it to a unit. `workdir`
    is the unit's (its checkpoints); the process keeps its log and job files in a directory of its own, which lives as
    long as the process."""

    def __init__(self, start=None):
        from conformance.vllm.engine_process import EngineProcess

        self._start = start or EngineProcess      # a directory -> an unstarted EngineProcess (tests hand their own)
        self._process = None
        self._directory: str | None = None
        self.started = 0                          # engine processes started so far (the tests count them)

    @contextlib.contextmanager
    def __call__(self, workdir=None):
        jobs = EngineJobs(self._ready())
        keep = False
        try:
            yield jobs
            keep = not jobs.engine_raised
        finally:
            if not keep:
                self.close()

    def _ready(self):
        """The kept process if it is still alive, else a fresh one (started here; EngineFailed if it cannot start)."""
        process = self._process
        if process is not None and process.proc is not None and process.proc.poll() is None:
            return process
        self.close()
        self._directory = scratch_dirs.new_directory("engine-process")
        process = self._start(Path(self._directory))
        try:
            process.__enter__()
        except BaseException:
            process.__exit__(None, None, None)
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None
            raise
        self.started += 1
        self._process = process
        return process

    def close(self) -> None:
        """End the kept process (its stdin closed, then killed if it does not exit) and remove its directory."""
        process, self._process = self._process, None
        if process is not None:
            process.__exit__(None, None, None)
        directory, self._directory = self._directory, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
