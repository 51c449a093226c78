"""The values of the `--conformance-*` options, checked before anything is judged.

A value the harness cannot use is the caller's mistake, never the platform's: each parser here
raises `OptionError` with one line naming the option, the value and what is allowed, which the
pytest plugin turns into a usage error (exit 4, docs/exit-codes.md) before any check runs. Without
this, `--conformance-timeout=0` would time out every check and blame the platform.
"""

from __future__ import annotations

import math
import os

from conformance.collect.units import LEVELS

MAX_TIMEOUT_S = 86400.0   # one day per check: more is a typo, and select() cannot wait much longer anyway


class OptionError(ValueError):
    """An option's value cannot be used; the message is one line naming the option and the allowed values."""


def timeout(text: str | float) -> float:
    """`--conformance-timeout`: seconds, a finite number with 0 < SECONDS <= MAX_TIMEOUT_S."""
    allowed = f"a number of seconds greater than 0 and at most {MAX_TIMEOUT_S:g}"
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise OptionError(f"--conformance-timeout={text}: not a number; give {allowed}") from None
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
        raise OptionError(f"--conformance-timeout={text}: out of range; give {allowed} (the per-check time limit)")
    return value


def seed(text: str | int) -> int:
    """`--conformance-seed`: any integer."""
    try:
        return int(str(text).strip(), 10)
    except ValueError:
        raise OptionError(f"--conformance-seed={text}: not an integer; give a whole number such as 1234") from None


def level(text: str) -> str:
    """`--conformance-level`: one of LEVELS."""
    if text not in LEVELS:
        raise OptionError(f"--conformance-level={text}: unknown level; give one of {', '.join(LEVELS)}")
    return text


def input_file(option: str, path: str | None) -> str | None:
    """A file the run reads (`--conformance-waivers`, `--conformance-baseline`): None when the option was not
    given; an empty value (an unset variable in a CI script) is an error, not 'no file'."""
    if path is None:
        return None
    if not path.strip():
        raise OptionError(f"{option}= is empty: give the path of a file, or leave the option out")
    if os.path.isdir(path):
        raise OptionError(f"{option}={path}: is a directory, not a file")
    return path


def output_file(option: str, path: str | None) -> str | None:
    """A file the run writes (`--conformance-json`): None when not given; refused when empty or a directory
    (whether it can be written is found by the first write, which names the OS error)."""
    if path is None:
        return None
    if not path.strip():
        raise OptionError(f"{option}= is empty: give the path of the file to write, or leave the option out")
    if os.path.isdir(path) or path.endswith(os.sep):
        raise OptionError(f"{option}={path}: is a directory; give the path of a file (e.g. {path.rstrip(os.sep)}"
                          f"{os.sep}results.json)")
    return path
