"""Find the processes a test started, however deep, and whether any outlived what killed their starter (Linux /proc).

A process is named by (pid, start time), so a pid reused after its process ended is not mistaken for it. A test
marks what it starts with a unique value of MARKER_ENV, which every descendant inherits; xdist workers rewrite
their environment block (setproctitle), so a tree is also followed by parent pid before the kill.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

MARKER_ENV = "CONFORMANCE_TEST_PROCESS_MARKER"

Process = tuple[int, int]   # (pid, start time in clock ticks since boot)


def new_marker() -> str:
    return uuid.uuid4().hex


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live (not zombie) process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if fields[0] in ("Z", "X"):   # ended, waiting to be reaped: it runs nothing
        return None
    return int(fields[1]), int(fields[19])


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def marked(marker: str | None) -> set[Process]:
    """Live processes whose environment carries `marker` (none for None)."""
    if marker is None:
        return set()
    needle = f"{MARKER_ENV}={marker}".encode()
    found = set()
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle not in fh.read():
                    continue
        except OSError:
            continue
        stat = _stat(pid)
        if stat is not None:
            found.add((pid, stat[1]))
    return found


def tree(root: int) -> set[Process]:
    """`root` and its live descendants, by parent pid."""
    parents = {pid: stat for pid in _pids() if (stat := _stat(pid)) is not None}
    found, frontier = set(), [root]
    while frontier:
        pid = frontier.pop()
        if pid in parents:
            found.add((pid, parents[pid][1]))
            frontier.extend(child for child, (ppid, _) in parents.items() if ppid == pid)
    return found


def alive(processes: set[Process]) -> set[Process]:
    return {(pid, start) for pid, start in processes if (stat := _stat(pid)) is not None and stat[1] == start}


def command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    except OSError:
        return "(gone)"


def survivors(known: set[Process], marker: str | None, within: float) -> list[str]:
    """Wait up to `within` s for every process of `known`, and every one carrying `marker`, to end; the command
    lines of those that did not (empty when none)."""
    deadline = time.monotonic() + within
    while True:
        left = alive(known) | marked(marker)
        if not left or time.monotonic() >= deadline:
            return [f"{pid}: {command(pid)}" for pid, _ in sorted(left)]
        time.sleep(0.2)


def kill_all(known: set[Process], marker: str | None) -> None:
    """Clean up after a failed test: SIGKILL whatever of it still runs."""
    for pid, _ in alive(known) | marked(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def dead_pid() -> int:
    """The pid of a process that has ended (a short child, waited for): stands in for a killed run's process."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid
