"""Result messages the same from run to run: memory addresses and object reprs taken out.

Torch-free, so the pytest side (which never imports torch under xdist) applies it to the messages it builds itself
(a CRASH or TIMEOUT the kernel worker could not write) as the checks apply it to theirs.
"""

from __future__ import annotations

import re

# `<pkg.Cls object at 0x7f..>` -> `<Cls object>`; `<function f at 0x7f..>` -> `<function f>`; other addresses.
_OBJECT_REPR = re.compile(r"<(?:[\w.<>]+\.)?(\w+) object at 0x[0-9a-fA-F]+>")
_AT_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{8,}\b")


def sanitize(text: str | None) -> str | None:
    """`text` without memory addresses or object reprs, so the same run gives the same messages."""
    if text is None:
        return None
    text = _OBJECT_REPR.sub(r"<\1 object>", text)
    text = _AT_ADDRESS.sub("", text)
    return _ADDRESS.sub("0x...", text)
