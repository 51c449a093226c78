"""Shared-memory files (/dev/shm) that a run's children leave behind, and their removal.

vLLM's CPU collectives (`CpuCommunicator`'s shared-memory path, named from `VLLM_DIST_IDENT`) and its multiprocessing
executor (`multiprocessing.shared_memory` segments `psm_*`, semaphores `sem.mp-*`) create files in /dev/shm that only
their processes remove, and only when they end cleanly. A rank group or an engine the harness kills (a TIMEOUT, a
CRASH, a run stopped by CI) leaves them: 8 to 250 MB each, so a few killed runs fill a container's 64 MB /dev/shm and
every later run fails. The harness removes what its children left:

- a collective rank group's files by the identifier the group runner gave it (`conformance-<pid>-<hex>`), when the
  group is closed, and at a run's start those of a runner that is no longer alive (`remove_orphans`), with the
  reference communicator's (`reference-comm-<pid>-<hex>`, a file and named pipes that its ranks remove as soon as
  they have opened them, left only by a rank killed in those milliseconds);
- at a run's start and end, vLLM's files that no live process maps or holds open (`remove_unused`): a `vllm_dist_*`
  group file of any age (vLLM maps it for the group's whole life), and `psm_*` segments only when written since the
  run started (another program may hand such a file from one process to the next by name). Never multiprocessing's
  semaphores (`sem.mp-*`, 32 bytes each): glibc maps a semaphore under the temporary name it created it with, so a
  semaphore in use looks unused here (removing one broke a starting vLLM engine).

Only files of this user are touched, and never one that a live process maps or holds open.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

SHM_DIR = Path("/dev/shm")
IDENT_PREFIX = "conformance-"
_OURS = re.compile(r"^(?:conformance|reference-comm)-(\d+)-[0-9a-f]{8}(?:-|$)")
VLLM_GROUP_FILES = ("vllm_dist_",)                 # vLLM's CPU shared-memory groups: dead once no process maps them
MP_FILES = ("psm_",)                               # multiprocessing's shared-memory segments: this run's only


def new_ident() -> str:
    """A shared-memory identifier for a rank group this process starts: its files carry it as their prefix."""
    return f"{IDENT_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"


def in_use(directory: Path = SHM_DIR) -> set[str]:
    """Names of the files in `directory` that a live process maps or holds open (every readable /proc entry)."""
    prefix = str(directory).rstrip("/") + "/"
    used: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            with open(proc / "maps", errors="replace") as f:
                for line in f:
                    at = line.find(prefix)
                    if at >= 0:
                        used.add(line[at + len(prefix):].rstrip("\n").removesuffix(" (deleted)"))
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith(prefix):
                    used.add(target[len(prefix):])
        except OSError:          # the process ended, or is not ours to read
            continue
    return used


def _mine(path: Path) -> os.stat_result | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    return st if st.st_uid == os.getuid() and (path.is_file() or path.is_fifo()) else None


def _unlink(paths: list[Path]) -> list[str]:
    removed = []
    for path in paths:
        try:
            path.unlink()
            removed.append(path.name)
        except OSError:
            pass
    return removed


def remove_ident(ident: str, directory: Path = SHM_DIR) -> list[str]:
    """Remove this user's files named for rank-group identifier `ident` that no live process uses; their names."""
    if not ident.startswith(IDENT_PREFIX) or not directory.is_dir():
        return []
    names = [p for p in directory.iterdir() if p.name == ident or p.name.startswith(ident + "-")]
    if not names:
        return []
    used = in_use(directory)
    return _unlink([p for p in names if p.name not in used and _mine(p)])


def alive(pid: int) -> bool:
    """Whether process `pid` exists (another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_orphans(directory: Path = SHM_DIR) -> list[str]:
    """Remove rank-group files whose runner process is gone (a run killed before it could close its groups)."""
    if not directory.is_dir():
        return []
    dead = []
    for p in directory.iterdir():
        m = _OURS.match(p.name)
        if m and not alive(int(m.group(1))):
            dead.append(p)
    if not dead:
        return []
    used = in_use(directory)
    return _unlink([p for p in dead if p.name not in used and _mine(p)])


def remove_unused(since: float | None, directory: Path = SHM_DIR) -> list[str]:
    """Remove vLLM's shared-memory files that no live process uses: group files of any age, multiprocessing files
    written at or after `since` (a time.time(); None: none of them)."""
    if not directory.is_dir():
        return []
    candidates = []
    for p in directory.iterdir():
        if p.name.startswith(VLLM_GROUP_FILES) or (since is not None and p.name.startswith(MP_FILES)):
            candidates.append(p)
    if not candidates:
        return []
    used = in_use(directory)
    out = []
    for p in candidates:
        st = _mine(p)
        if st is None or p.name in used:
            continue
        if p.name.startswith(MP_FILES) and st.st_mtime < since - 1.0:
            continue
        out.append(p)
    return _unlink(out)
