"""The exception of a given type that an exception is, or was raised from (its __cause__ / __context__ chain).

Checks and the bridge's release errors both ask it: a donation refusal inductor wraps in its own error, a
`ReleaseLacks` a layer constructor re-raised. It lives in `collect`, below both, so either can use it."""

from __future__ import annotations

from typing import TypeVar

E = TypeVar("E", bound=BaseException)


def in_chain(exc: BaseException | None, error_type: type[E]) -> E | None:
    """`exc` or the first exception of its cause/context chain that is an `error_type`, else None (cycles end it)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, error_type):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
