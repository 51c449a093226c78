"""What the kernel worker is running right now, kept in a file its parent reads after a crash.

The parent names the file (environment variable NOTE_ENV). The worker records the unit when it starts
one; the property check adds each hypothesis draw; every call of the platform's code (`call_impl`)
adds what is called and its arguments (shapes, strides, dtypes, scalars). Each record rewrites the
file in place (one small JSON object) before the call, so when the process dies of a signal the file
says which op, provider, case, dtype, draw and arguments killed it. Without the variable (in-process
runs: tests, `repro --in-process`) nothing is written.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Sequence
from typing import Any

NOTE_ENV = "CONFORMANCE_RUNNING_NOTE"

_fd: int | None = None
_note: dict[str, Any] = {}


def open_from_environment() -> None:
    """Start recording into the file the parent named, if it named one."""
    global _fd
    path = os.environ.get(NOTE_ENV)
    if path and _fd is None:
        _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)


def _write() -> None:
    if _fd is None:
        return
    data = json.dumps(_note, sort_keys=True).encode()
    os.pwrite(_fd, data, 0)
    os.ftruncate(_fd, len(data))


def start_unit(unit_fields: dict[str, Any]) -> None:
    """A new unit starts: forget the previous unit's draw and call."""
    _note.clear()
    _note["unit"] = dict(unit_fields)
    _write()


def set_draw(draw: str | None) -> None:
    """The hypothesis draw the next calls run on (the `--draw` text a repro takes)."""
    _note["draw"] = draw
    for key in ("call", "args", "returned"):
        _note.pop(key, None)
    _write()


def before_call(where: str, fn: Any, args: Sequence[Any]) -> None:
    """The platform's code `fn` is about to be called with `args` (described, not stored)."""
    if _fd is None:
        return
    _note["call"] = where
    _note["args"] = describe_call(fn, args)
    _note["returned"] = False
    _write()


def after_call() -> None:
    """The call noted last has returned (a crash from here on is outside it)."""
    if _fd is None or "call" not in _note:
        return
    _note["returned"] = True
    _write()


def read(path: str | None) -> dict[str, Any]:
    """The last record in `path` ({} when there is none or it cannot be read)."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        note, _ = json.JSONDecoder().raw_decode(text)
    except (OSError, ValueError):
        return {}
    return note if isinstance(note, dict) else {}


def _param_names(fn: Any, n: int) -> list[str]:
    try:
        names = [p.name for p in inspect.signature(fn).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        schema = getattr(fn, "_schema", None)
        names = [a.name for a in schema.arguments] if schema is not None else []
    return (names + [f"arg{i}" for i in range(len(names), n)])[:n]


def describe_value(value: Any) -> str:
    """A tensor as `Tensor(shape):dtype` plus its strides and offset when not contiguous from 0; a scalar by repr;
    anything else by type name (no addresses, so the same run gives the same text)."""
    import torch

    if isinstance(value, torch.Tensor):
        text = f"Tensor{tuple(value.shape)}:{str(value.dtype).removeprefix('torch.')}"
        if not value.is_contiguous() or value.storage_offset():
            text += f", stride={tuple(value.stride())}"
            if value.storage_offset():
                text += f", offset={value.storage_offset()}"
        return text
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, (tuple, list)) and len(value) <= 8:
        inner = ", ".join(describe_value(v) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return type(value).__name__


def describe_call(fn: Any, args: Sequence[Any]) -> str:
    return ", ".join(f"{name}={describe_value(a)}" for name, a in zip(_param_names(fn, len(args)), args))
