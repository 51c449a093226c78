"""Errors raised by the compile pipeline, and a helper to reach them through Dynamo's wrapping."""

from __future__ import annotations


class CompilationPipelineError(RuntimeError):
    """A pass could not keep the pipeline's promise (for example an IR op survived lowering)."""


class DonatedInputReuseError(ValueError):
    """A value passed as an activation to `<op>.maybe_inplace` is read again after the call.

    Attributes: `op` (IR op name), `value` (the donated graph value), `user` (the later reader),
    `where` (user source line when Dynamo recorded one).
    """

    def __init__(self, message: str, *, op: str, value: str, user: str, where: str | None = None):
        super().__init__(message)
        self.op = op
        self.value = value
        self.user = user
        self.where = where


def find_cause(exc: BaseException, exc_type: type[BaseException]) -> BaseException | None:
    """The first `exc_type` in `exc`'s cause/context chain (torch._dynamo wraps backend errors in
    `BackendCompilerFailed`, whose `__cause__` / `inner_exception` is the original), else None."""
    seen = set()
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, exc_type):
            return current
        todo.extend([current.__cause__, current.__context__, getattr(current, "inner_exception", None)])
    return None
