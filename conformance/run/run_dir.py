"""A directory one conformance run shares between the pytest controller and its xdist workers.

The controller (or a lone pytest process) creates it and hands its path to each xdist worker
through `workerinput`. Workers append what every process must know (providers that hung or
crashed, see `conformance.run.poison`) and record their collection (how many results the run will
write, whether something was deselected), so the controller can fill the results file's `run`
block. Appends are single `write` calls of one short line on an O_APPEND descriptor: atomic on
POSIX, no lock needed.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from conformance import scratch_dirs

WORKERINPUT_KEY = "conformance_run_dir"
ZYGOTE_KEY = "conformance_zygote"   # the socket of the run's zygote (conformance.run.zygote), when it has one


class RunDir:
    """`RunDir.create()` in the controller, `RunDir(path)` in a worker; `remove()` by the creator only."""

    def __init__(self, path: str, owner: bool = False):
        self.path = path
        self.owner = owner

    @classmethod
    def create(cls) -> RunDir:
        """A new run directory, named for this process (`conformance.scratch_dirs`: a killed run's is removed by the
        next run)."""
        return cls(scratch_dirs.new_directory("run"), owner=True)

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def append(self, name: str, record: dict[str, Any]) -> None:
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        fd = os.open(self._file(name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def records(self, name: str) -> list[dict[str, Any]]:
        """Every complete line appended to `name` so far (a line still being written is skipped)."""
        try:
            with open(self._file(name), "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return []
        out = []
        for line in data.split(b"\n"):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def write_json(self, name: str, obj: Any) -> None:
        tmp = self._file(name + ".tmp")
        with open(tmp, "w") as fh:
            json.dump(obj, fh)
        os.replace(tmp, self._file(name))

    def read_json(self, name: str) -> Any | None:
        try:
            with open(self._file(name)) as fh:
                return json.load(fh)
        except (FileNotFoundError, ValueError):
            return None

    def remove(self) -> None:
        if self.owner:
            shutil.rmtree(self.path, ignore_errors=True)
