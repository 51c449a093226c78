"""What inductor's caches must key on when our post-grad passes run inside inductor.

Inductor's FX graph cache and AOTAutograd's cache key a compiled graph on the graph, torch's
version and config, and the `uuid()` of each custom pass (torch's `CustomGraphPass` contract: a
new value misses every entry made under another). Our post-grad passes' output depends on
  - their own code (reference_impl/compilation/) and the IR's selection rules (reference_impl/ir/);
  - which implementation each IR op lowers to: its priority list (the current config and platform
    or a `set_priority` override), the `supported` flags and the predicates;
  - the implementations' code: the source file of each implementation, predicate and fake, and
    the kernel sources (csrc/, whose schemas the lowered graph calls);
  - what the pre-grad pass found for this graph (the donated inputs).
`pipeline_uuid` hashes all of it, so a change of any of them compiles afresh.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import marshal
from collections.abc import Callable, Iterable
from pathlib import Path

from reference_impl.ir.op import IrOp
from reference_impl.kernels._csrc import csrc_dir

_PACKAGE = Path(__file__).resolve().parent.parent        # reference_impl/
SOURCE_TREES = (_PACKAGE / "compilation", _PACKAGE / "ir")


def pipeline_uuid(pipeline: Iterable[str], per_compile: object = ()) -> str:
    """The uuid of our post-grad passes for one compilation: `pipeline` names the inner compiler and
    the passes in order, `per_compile` is what the pre-grad pass found (its repr is hashed)."""
    hasher = hashlib.sha256()
    for part in (*pipeline, repr(per_compile), _code_digest(), _ir_state_digest()):
        hasher.update(part.encode())
        hasher.update(b"\0")
    return hasher.hexdigest()


@functools.cache
def _code_digest() -> str:
    """Our passes, the IR and the kernel sources, as they are on disk in this process."""
    hasher = hashlib.sha256()
    for root, pattern in [*((tree, "*.py") for tree in SOURCE_TREES), (csrc_dir(), "*")]:
        for path in sorted(p for p in root.rglob(pattern) if p.is_file() and "__pycache__" not in p.parts):
            hasher.update(str(path.relative_to(root)).encode())
            hasher.update(path.read_bytes())
    return hasher.hexdigest()


def _ir_state_digest() -> str:
    """Every declared IR op's lowering choice as it stands now: priority list, and per provider
    whether it is supported and in place, with the code of its function and predicate."""
    lines = []
    for name in sorted(IrOp.registry):
        op = IrOp.registry[name]
        try:
            priority = op.get_priority()
        except Exception as exc:        # the lowering fails the same way; key on the failure
            priority = [f"{type(exc).__name__}: {exc}"]
        lines.append(f"{name} {priority} fake={_code_of(op._fake_fn)}")
        for provider, impl in sorted(op.impls.items()):
            lines.append(f"  {provider} supported={impl.supported} inplace={impl.inplace} "
                         f"fn={_code_of(impl.impl_fn)} predicate={_code_of(impl.supports_args)}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _code_of(fn: Callable | None) -> str:
    """A digest of the source file that defines `fn` (of its class for a callable object), else of
    its compiled code; "-" for None."""
    if fn is None:
        return "-"
    for target in (fn, type(fn)):
        try:
            path = inspect.getsourcefile(target)
        except TypeError:
            continue
        if path and Path(path).is_file():
            return _file_digest(path)
    code = getattr(fn, "__code__", None)
    if code is not None:
        return hashlib.sha256(marshal.dumps(code)).hexdigest()
    return f"{type(fn).__module__}.{type(fn).__qualname__}"


@functools.cache
def _file_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
