"""What a lowering failure means for the vendor, and a cheap trace that finds it per dtype.

Lowering (reference_impl.compilation.lowering) traces the selected implementation with make_fx on
the graph's fake tensors, batch dimension symbolic. `classify_lowering_failure` is the one place
that turns an exception of that trace (or of a whole compile) into a diagnosis with its fix; an
exception it does not recognise stays an ERROR. `trace_failure` repeats lowering's trace outside
torch.compile, so a compile check can tell whether another dtype of the same provider fails alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import torch

from conformance.checks import fakes
from conformance.checks.batch import at_least_two_rows
from conformance.checks.common import exception_line


@dataclasses.dataclass(frozen=True)
class LoweringFailure:
    """`problem` (what is wrong), `fix` (what to do), `cause` (the exception's first line), `at` (vendor frame)."""

    problem: str
    fix: str
    cause: str
    at: str | None = None

    def message(self, op: str, provider: str) -> str:
        where = f" (at {self.at})" if self.at else ""
        return f"provider '{provider}' of {op} is {self.problem}{where}: {self.cause}. Fix: {self.fix}"


READS_FAKE_DATA = ("not traceable by make_fx: it reads the data of a fake tensor (lowering traces every "
                   "implementation on fake tensors, which have sizes but no data)")
WRAP_IN_CUSTOM_OP = ("wrap the kernel launch in a torch.library custom op (torch.library.custom_op) with a fake "
                     "implementation (register_fake) that returns empty outputs of the right shape, dtype and "
                     "device, and call that op from the implementation")

BRANCHES_ON_VALUES = ("not traceable by make_fx: it branches on tensor values while traced (a Python branch on "
                      "`bool(t)` / `t.item()`; some torch versions raise a data-dependent guard there, others "
                      "trace one side of the branch)")
NO_VALUE_BRANCHES = ("decide from static properties (shapes, dtypes, argument values) in Python, and move any "
                     "value-dependent choice into the kernel or into a torch.library custom op")

# (exception type names or None, message pattern or None, problem, fix, raised inside the implementation only):
# the first row that matches wins. A data-dependent guard is the implementation's fault only when raised through
# its own frame; the harness or the pipeline can raise the same type.
RULES: list[tuple[tuple[str, ...] | None, str | None, str, str, bool]] = [
    (None, r"Cannot access data pointer of Tensor", READS_FAKE_DATA, WRAP_IN_CUSTOM_OP, False),
    (None, r"Cannot call \w+\(\) on tensor with symbolic sizes", READS_FAKE_DATA, WRAP_IN_CUSTOM_OP, False),
    (None, r"\.numpy\(\) is not supported for tensor subclasses", READS_FAKE_DATA, WRAP_IN_CUSTOM_OP, False),
    (("DataDependentOutputException",), None, READS_FAKE_DATA, WRAP_IN_CUSTOM_OP, False),
    (("GuardOnDataDependentSymNode",), None, BRANCHES_ON_VALUES, NO_VALUE_BRANCHES, True),
]


def _chain(exc: BaseException):
    """`exc` and its causes (torch._dynamo wraps backend errors in BackendCompilerFailed), once each."""
    seen, todo = set(), [exc]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo.extend([current.__cause__, current.__context__, getattr(current, "inner_exception", None)])


def _package_root(fn) -> str | None:
    """Directory of the top-level package that defines `fn` (the vendor's code lives below it)."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    top = sys.modules.get(module.__name__.split(".")[0]) if module is not None else None
    path = getattr(top, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) if path else None


def _vendor_frame(exc: BaseException, impl_fn=None) -> str | None:
    """`pkg/file.py:line in fn` of the innermost frame in the implementation's own package (else the
    innermost frame outside torch, the harness and the reference)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    root = _package_root(impl_fn) if impl_fn is not None else None
    if root is not None:
        mine = [f for f in frames if os.path.abspath(f.filename).startswith(root + os.sep)]
    else:
        skip = tuple(os.sep + d + os.sep for d in ("torch", "conformance", "reference_impl", "sympy"))
        mine = [f for f in frames if not any(s in f.filename for s in skip)]
    if not mine:
        return None
    found = mine[-1]
    return f"{os.sep.join(found.filename.split(os.sep)[-2:])}:{found.lineno} in {found.name}"


def _raised_inside(exc: BaseException, impl_fn) -> bool:
    """Whether `exc`'s traceback passes through `impl_fn`'s own frame."""
    code = getattr(impl_fn, "__code__", None)
    return code is not None and any(frame.f_code is code for frame, _ in traceback.walk_tb(exc.__traceback__))


def classify_lowering_failure(exc: BaseException, impl_fn=None) -> LoweringFailure | None:
    """The diagnosis of a failed trace or compile, from its exception chain; None when unrecognised.
    `impl_fn`, when given, locates the failing line in the implementation's own package."""
    for current in _chain(exc):
        names = {cls.__name__ for cls in type(current).__mro__}
        text = str(current)
        for types_, pattern, problem, fix, inside_only in RULES:
            if types_ is not None and not names & set(types_):
                continue
            if pattern is not None and not re.search(pattern, text):
                continue
            if inside_only and not _raised_inside(current, impl_fn):
                continue
            return LoweringFailure(problem, fix, exception_line(current), _vendor_frame(current, impl_fn))
    return None


def trace_failure(op, impl, args: Sequence[Any]) -> LoweringFailure | None:
    """Trace `impl` as lowering does (make_fx on fakes, symbolic batch, in-place activations cloned);
    the classified failure, or None when it traces or fails in a way this module does not know."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch.fx.experimental.proxy_tensor import make_fx

    fa = fakes.symbolic(op, at_least_two_rows(op, args))
    tensors_at = [i for i, a in enumerate(fa.args) if isinstance(a, torch.Tensor)]
    cloned = set(op.activation_indices) if impl.inplace else set()

    def run(*traced):
        call = list(fa.args)
        for i, t in zip(tensors_at, traced):
            call[i] = torch.ops.aten.clone.default(t) if i in cloned else t
        return impl.impl_fn(*call)

    # Inside torch.compile, torch versions that have this context report is_compiling() during lowering.
    session = getattr(torch.compiler, "_compile_session_context", contextlib.nullcontext)
    try:
        with session(), fa.mode, torch.no_grad(), enable_python_dispatcher():
            make_fx(run, tracing_mode="real")(*[fa.args[i] for i in tensors_at])
    except Exception as exc:  # noqa: BLE001 - classified below; unknown ones are left to the compile run
        return classify_lowering_failure(exc, impl.impl_fn)
    return None
