"""What the engine process's log says about a worker process that died during a run (engine_runner).

With `tensor_parallel_size` > 1 vLLM's multiprocessing executor runs the model in a worker process per rank; a worker
that dies (a segfault in a kernel) surfaces in the engine as `RuntimeError: cancelled` raised while reading the
workers' message queue, which names none of the code that failed. The workers write to the engine process's stderr
(its log file), so the runner reads what was written there during the run: vLLM's "Worker proc NAME died unexpectedly
(exit code: N)" and, after torch's "Segfault encountered", the innermost frame outside the C library.
"""

from __future__ import annotations

import os
import re
import signal

_DIED = re.compile(r"Worker proc (\S+) died unexpectedly \(exit code: (-?\d+)\)")
_SEGFAULT = "Segfault encountered"
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (.+)')
_LIBC = ("sysdeps/", "libc_", "<unknown>")


def stderr_offset() -> int | None:
    """How much of this process's stderr file is written so far; None where stderr is not a regular file."""
    try:
        path = os.readlink("/proc/self/fd/2")
        return os.path.getsize(path) if os.path.isfile(path) else None
    except OSError:
        return None


def worker_deaths(offset: int | None) -> str | None:
    """What the stderr file says since `offset` about workers that died: names, exit codes and where a segfault was
    raised; None if nothing (or no file)."""
    if offset is None:
        return None
    try:
        with open(os.readlink("/proc/self/fd/2"), "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return describe(text)


def describe(text: str) -> str | None:
    """The deaths a log text reports, in words (see the module docstring)."""
    deaths = []
    for name, code in dict.fromkeys(_DIED.findall(text)):
        rc = int(code)
        how = f"exit code {rc}"
        if rc < 0:
            try:
                how += f", {signal.Signals(-rc).name}"
            except ValueError:
                pass
        deaths.append(f"{name} died ({how})")
    where = None
    if _SEGFAULT in text:
        for line in text.split(_SEGFAULT, 1)[1].splitlines():
            frame = _FRAME.search(line)
            if frame and not any(part in frame.group(1) for part in _LIBC):
                where = f"{frame.group(1)} line {frame.group(2)}, in {frame.group(3).strip()[:120]}"
                break
    if where is not None:
        deaths.append(f"a segfault, innermost frame: {where}")
    return "; ".join(deaths) or None
