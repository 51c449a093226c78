"""The CRASH message: what was running when a process died, and the stacks of the thread that crashed.

Built by the parent of a process that died of a signal (the kernel worker's parent, or `repro`'s
supervisor) from three files of that process alone: the running note (conformance.results.running_note:
unit, draw, call and arguments), faulthandler's dump (Python stacks) and the process's stderr, where
torch's fatal-signal handler prints each thread's native stack; only the crashing thread's block is
kept. The first line says everything a vendor needs to find the case (reports show first lines);
the stacks follow. Addresses and process ids are dropped so a rerun gives the same message.
"""

from __future__ import annotations

import re
import signal

MAX_PYTHON_LINES = 40
MAX_NATIVE_FRAMES = 30

NATIVE_STACK_HEADER = re.compile(r"^(SIG[A-Z0-9]+)\((\d+)\), PID: \d+, Thread \d+:\s*$", re.M)
_FRAME_ADDRESS = re.compile(r" \(0x[0-9a-fA-F]+ in ")
# faulthandler's line for the harness's entry into a check (conformance.checks.run_unit): the frames below it are the
# harness's process plumbing
_CHECK_ENTRY_FRAME = re.compile(r'^  File ".*[/\\]conformance[/\\]checks[/\\]__init__\.py", line \d+ in run_unit$')


def describe_exit(rc: int | None) -> str:
    if rc is None:
        return "exit status unknown"
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name} ({-rc})"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def died_of(rc: int | None) -> str:
    """'died of signal SIGSEGV (11)' / 'exited with status 3' / 'died (exit status unknown)'."""
    if rc is None:
        return "died (exit status unknown)"
    if rc < 0:
        return "died of signal " + describe_exit(rc).removeprefix("killed by signal ")
    return f"exited with status {rc}"


# faulthandler's names of the fatal signals it reports (CPython's faulthandler.c)
_FAULTHANDLER_SIGNALS = {"Segmentation fault": signal.SIGSEGV, "Aborted": signal.SIGABRT, "Bus error": signal.SIGBUS,
                         "Illegal instruction": signal.SIGILL, "Floating point exception": signal.SIGFPE,
                         "Floating-point exception": signal.SIGFPE}


def first_fatal_signal(fault_text: str) -> int | None:
    """The signal faulthandler reported first: the one the code raised. A process can end of another one, when a
    crash handler that runs after faulthandler (torch's native stack printer allocates memory) aborts itself."""
    match = re.search(r"^Fatal Python error: (.+?)\s*$", fault_text, re.M)
    sig = _FAULTHANDLER_SIGNALS.get(match.group(1)) if match else None
    return int(sig) if sig is not None else None


def native_stack(stderr_text: str) -> str | None:
    """The crashing thread's frames from torch's fatal-signal handler output (the block whose frames include
    the handler's own `fatalSignalHandler`, i.e. the thread the signal hit), without the handler's frames."""
    headers = list(NATIVE_STACK_HEADER.finditer(stderr_text))
    for i, header in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(stderr_text)
        block = stderr_text[header.end():end]
        if "fatalSignalHandler" not in block:
            continue
        frames = [ln.strip() for ln in block.splitlines() if ln.strip()]
        handler = max((k for k, ln in enumerate(frames) if "FatalSignalHandler" in ln), default=-1)
        frames = [_FRAME_ADDRESS.sub(" (in ", f) for f in frames[handler + 1:]
                  if f.startswith("frame #") or f.startswith("<omitting")]
        if frames and re.search(r"\b_start\b", frames[-1]):
            # below the last Python frames lies the process's entry (libc, `_start`), numbered by how deep the
            # harness's plumbing was: cut, like the Python stack below the check's entry
            last_python = max((k for k, f in enumerate(frames) if f.startswith("<omitting")), default=None)
            if last_python is not None:
                frames = frames[:last_python]
        if len(frames) > MAX_NATIVE_FRAMES:
            frames = frames[:MAX_NATIVE_FRAMES] + [f"... {len(frames) - MAX_NATIVE_FRAMES} more frames"]
        return "\n".join(frames) or None
    return None


def python_stack(fault_text: str) -> str | None:
    """faulthandler's dump without its 'Extension modules' list (the thread lines keep their order: the
    current, crashing thread is marked 'Current thread'), each stack cut below the harness's entry into the check
    (`run_unit`): what called it (a kernel worker started from scratch or forked, `conformance repro`) says nothing
    about the crash, and the same check gives the same message whichever process ran it."""
    lines = []
    below_entry = False
    for line in fault_text.splitlines():
        if line.startswith("Extension modules:"):
            break
        if line.startswith("Fatal Python error:") or not line.strip():
            continue
        if below_entry and line.startswith("  File "):
            continue
        below_entry = bool(_CHECK_ENTRY_FRAME.match(line))
        lines.append(re.sub(r"0x[0-9a-fA-F]+", "0x...", line.rstrip()))
    if len(lines) > MAX_PYTHON_LINES:
        lines = lines[:MAX_PYTHON_LINES] + [f"... {len(lines) - MAX_PYTHON_LINES} more lines"]
    return "\n".join(lines) or None


def running_line(note: dict) -> str:
    """What was running, the platform's call and its arguments first (reports show first lines, so the shapes come
    early): 'in <call> called with <args>; hypothesis draw <draw> (numerics.ir_case of op X, provider P, case C,
    dtype D)'."""
    unit = note.get("unit") or {}
    if not unit:
        return "before it had started a check (nothing was recorded as running)"
    fields = ", ".join(f"{key} {unit[key]}" for key in ("op", "provider", "case", "dtype") if unit.get(key))
    check = f"{unit.get('family')}.{unit.get('check')}" + (f" of {fields}" if fields else "")
    if not note.get("call"):
        return f"while running {check}, before it called the platform's code"
    args = note.get("args") or "no arguments"
    text = (f"after {note['call']} had returned (called with {args}), in the harness's code" if note.get("returned")
            else f"in {note['call']} called with {args}")
    if note.get("draw"):
        text += f"; hypothesis draw {note['draw']}"
    return f"{text} ({check})"


def crash_message(rc: int | None, note: dict, fault_text: str, stderr_text: str, who: str) -> str:
    """The CRASH message of the process `who` ('the worker process running this check') that ended with `rc`."""
    first = first_fatal_signal(fault_text)
    if rc is not None and rc < 0 and first is not None and first != -rc:
        lines = [f"{who} {died_of(-first)} {running_line(note)}.",
                 f"(It then {died_of(rc)} while its crash handlers ran; the first signal is the code's.)"]
    else:
        lines = [f"{who} {died_of(rc)} {running_line(note)}."]
    py = python_stack(fault_text)
    native = native_stack(stderr_text)
    if py:
        lines += ["Python stack of the crashed process (most recent call first):", py]
    if native:
        lines += ["Native stack of the crashing thread:", native]
    if not py and not native:
        tail = "\n".join(ln for ln in stderr_text.strip().splitlines()[-20:]
                         if not ln.startswith("--- conformance worker:"))
        lines += ["No stack was recorded; the process's last output:", tail or "(none)"]
    return "\n".join(lines)
