"""Recognise an implementation that reads tensor values while the compile lowering traces it.

Lowering traces an implementation on fake tensors, where a Python branch on values (`bool(t)`,
`if t.item():`) raises a data-dependent-guard error. Some torch versions raise it where others
let `torch.compiler.is_compiling()` steer the implementation down another path; either way the
implementation is at fault, so the compile family reports a FAIL with this diagnosis rather
than an ERROR, and gives the same verdict on every supported torch.
"""

from __future__ import annotations

import traceback
from types import CodeType


def _data_dependent_types() -> tuple[type[BaseException], ...]:
    """The exception types of reading values under tracing, as far as this torch has them."""
    found = []
    try:
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

        found.append(GuardOnDataDependentSymNode)
    except ImportError:
        pass
    try:
        from torch._subclasses.fake_tensor import DataDependentOutputException

        found.append(DataDependentOutputException)
    except ImportError:
        pass
    return tuple(found)


def _chain(exc: BaseException | None):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _raised_through(exc: BaseException, code: CodeType) -> bool:
    return any(frame.f_code is code for frame, _ in traceback.walk_tb(exc.__traceback__))


def data_dependent_cause(exc: BaseException, impl_fn) -> BaseException | None:
    """The data-dependent-guard error in `exc`'s chain raised inside `impl_fn`, else None.

    Only errors whose traceback passes through the implementation's own frame count: the same
    error raised by the harness or the compile pipeline stays an ERROR.
    """
    types = _data_dependent_types()
    code = getattr(impl_fn, "__code__", None)
    if not types or code is None:
        return None
    for link in _chain(exc):
        if isinstance(link, types) and _raised_through(link, code):
            return link
    return None


def diagnosis(exc: BaseException, impl_fn) -> str | None:
    """'branches on tensor values while traced: ...' for such an error, else None."""
    cause = data_dependent_cause(exc, impl_fn)
    if cause is None:
        return None
    first = (str(cause).strip().splitlines() or [""])[0][:300]
    return (f"branches on tensor values while traced: {type(cause).__name__}: {first} (the implementation "
            "reads tensor values in Python; under torch.compile it must not)")
