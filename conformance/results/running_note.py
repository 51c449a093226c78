"""What the kernel worker is running right now, kept in a file its parent reads after a crash.

The parent names the file (environment variable NOTE_ENV). The worker records the unit when it starts
one; the property check adds each hypothesis draw; every call of the platform's code (`call_impl`)
adds what is called and its arguments (shapes, strides, dtypes, scalars). The file is one status byte
(`C`: in the call, `R`: it returned) and one JSON object, rewritten in place before the call (a longer
earlier record's tail may follow; the reader stops at the object's end) and flipped to `R` by one
byte after it, so when the process dies of a signal the file says which op, provider, case, dtype,
draw and arguments killed it, at a few tens of microseconds per call. Without the variable
(in-process runs: tests, `repro --in-process`) nothing is written.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from collections.abc import Sequence
from typing import Any

NOTE_ENV = "CONFORMANCE_RUNNING_NOTE"

_fd: int | None = None
_note: dict[str, Any] = {}
_unit_json = "null"   # the current unit, encoded once per unit


def open_from_environment() -> None:
    """Start recording into the file the parent named, if it named one."""
    global _fd
    path = os.environ.get(NOTE_ENV)
    if path and _fd is None:
        _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)


def _write(status: bytes = b"C") -> None:
    if _fd is None:
        return
    fields = "".join(f", {json.dumps(key)}: {json.dumps(_note[key])}" for key in ("draw", "call", "args") if key in _note)
    os.pwrite(_fd, status + f'{{"unit": {_unit_json}{fields}}}'.encode(), 0)


def start_unit(unit_fields: dict[str, Any]) -> None:
    """A new unit starts: forget the previous unit's draw and call."""
    global _unit_json
    _note.clear()
    _unit_json = json.dumps(unit_fields, sort_keys=True)
    _write()


def set_draw(draw: str | None) -> None:
    """The hypothesis draw the next calls run on (the `--draw` text a repro takes)."""
    _note["draw"] = draw
    for key in ("call", "args"):
        _note.pop(key, None)
    _write()


def before_call(where: str, fn: Any, args: Sequence[Any]) -> None:
    """The platform's code `fn` is about to be called with `args` (described, not stored)."""
    if _fd is None:
        return
    _note["call"] = where
    _note["args"] = describe_call(fn, args)
    _write()


def after_call() -> None:
    """The call noted last has returned (a crash from here on is outside it): one byte."""
    if _fd is not None:
        os.pwrite(_fd, b"R", 0)


def read(path: str | None) -> dict[str, Any]:
    """The last record in `path` ({} when there is none or it cannot be read)."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        note, _ = json.JSONDecoder().raw_decode(text, 1)
    except (OSError, ValueError):
        return {}
    if not isinstance(note, dict):
        return {}
    if "call" in note:
        note["returned"] = text[:1] == "R"
    return note


@functools.lru_cache(maxsize=1024)
def _signature_names(fn: Any) -> tuple[str, ...]:
    try:
        return tuple(p.name for p in inspect.signature(fn).parameters.values()
                     if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    except (TypeError, ValueError):
        schema = getattr(fn, "_schema", None)
        return tuple(a.name for a in schema.arguments) if schema is not None else ()


def _param_names(fn: Any, n: int) -> list[str]:
    try:
        names = list(_signature_names(fn))
    except TypeError:   # not hashable
        names = []
    return (names + [f"arg{i}" for i in range(len(names), n)])[:n]


def describe_value(value: Any) -> str:
    """A tensor as `Tensor(shape):dtype` plus its strides and offset when not contiguous from 0; a scalar by repr;
    anything else by type name (no addresses, so the same run gives the same text)."""
    import torch

    if isinstance(value, torch.Tensor):
        text = f"Tensor{tuple(value.shape)}:{str(value.dtype).removeprefix('torch.')}"
        if _is_fake_or_symbolic(value):   # asking a symbolic tensor about its layout could add guards: shape only
            return text + " (fake)"
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


@functools.lru_cache(maxsize=1)
def _fake_types() -> tuple[type, type]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor, torch.SymInt


def _is_fake_or_symbolic(t) -> bool:
    fake, symint = _fake_types()
    return isinstance(t, fake) or t.is_meta or any(isinstance(s, symint) for s in t.shape)


def describe_call(fn: Any, args: Sequence[Any]) -> str:
    return ", ".join(f"{name}={describe_value(a)}" for name, a in zip(_param_names(fn, len(args)), args))
