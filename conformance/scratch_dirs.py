"""Directories the harness's processes make for their own files, and what killed processes left of them.

A conformance run killed from outside (SIGKILL: an OOM kill, `timeout -s KILL`) cannot remove its directories, and a
kernel worker ends with `os._exit` (skipping torch's teardown), which runs no finalizer: before this module, every
run under `--platform=vllm` left a vLLM model config and an engine's directory in /tmp, and every killed run its run
directory, hundreds a day on a CI machine. So:

- `directory(kind)` / `new_directory(kind)`: a directory named `conformance-<kind>-<pid>-<pidns>-<random>` (pidns:
  the process's pid namespace, as /proc/self/ns/pid's inode). In a kernel worker of a run it is made inside the run's
  directory (beside the worker's running note), which the run removes even when it had to kill the worker; elsewhere
  in the temporary directory.
- `remove_orphans()`, at a run's start: the temporary directory's directories of this user, named so, of this pid
  namespace, whose process is gone. A directory whose process number was reused by a live process is kept (the next
  run takes it); one of another pid namespace (a container sharing /tmp, where its process numbers mean nothing here)
  is never touched, nor one of a live process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator

from conformance import shm_files
from conformance.results import running_note

PREFIX = "conformance-"
_KIND = re.compile(r"^[a-z]+(?:-[a-z]+)*$")
_ORPHAN = re.compile(r"^conformance-[a-z]+(?:-[a-z]+)*-(\d+)-(\d+)-[A-Za-z0-9_]{8}$")   # mkdtemp's suffix: 8 characters


def _pid_namespace() -> int:
    """This process's pid namespace (the inode of /proc/self/ns/pid; 0 where there is none to read)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def run_directory() -> str | None:
    """The run's directory when this process is a kernel worker of a run (its running note lies there), else None."""
    note = os.environ.get(running_note.NOTE_ENV)
    parent = os.path.dirname(note) if note else ""
    return parent if parent and os.path.isdir(parent) else None


def _prefix(kind: str) -> str:
    """`conformance-<kind>-<pid>-<pidns>-`, to which mkdtemp adds 8 random characters."""
    if not _KIND.match(kind):
        raise ValueError(f"scratch directory kind {kind!r}: lowercase words joined by '-' (no digits)")
    return f"{PREFIX}{kind}-{os.getpid()}-{_pid_namespace()}-"


def new_directory(kind: str, remove_at_exit: bool = False) -> str:
    """A new directory `conformance-<kind>-<pid>-<pidns>-<random>` (see the module's docstring for where).
    `remove_at_exit`: also removed when this process exits normally (for a directory kept as long as the process)."""
    path = tempfile.mkdtemp(prefix=_prefix(kind), dir=run_directory())
    if remove_at_exit:
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def name_length(kind: str) -> int:
    """How long the name of a directory `new_directory(kind)` makes in this process is (a socket's path has a limit)."""
    return len(_prefix(kind)) + 8


@contextlib.contextmanager
def directory(kind: str) -> Iterator[str]:
    """`new_directory(kind)` for the block, removed after it."""
    path = new_directory(kind)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_orphans(parent: str | None = None) -> list[str]:
    """Remove this user's scratch directories in `parent` (default: the temporary directory) whose process, of this
    pid namespace, is gone; their names, sorted."""
    parent = parent or tempfile.gettempdir()
    namespace = str(_pid_namespace())
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return []
    for entry in entries:
        m = _ORPHAN.match(entry.name)
        if not m or m.group(2) != namespace or shm_files.alive(int(m.group(1))):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.exists(entry.path):
            removed.append(entry.name)
    return sorted(removed)
