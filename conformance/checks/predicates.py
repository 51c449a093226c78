"""`supports_args` probed the way compile lowering calls it, on fake tensors that cost nothing.

docs/plugin-api.md §3: the answer is a Python bool in eager, the same at every batch size >= 2
(torch.compile specialises sizes 0 and 1, so a 1-row answer may differ, as `is_contiguous()` does),
and during lowering it receives fake tensors with a symbolic batch, or every dim symbolic under
`dynamic=True`, where a SymBool over non-batch sizes is fine (lowering resolves it by a guard
that specialises the graph on that static property). Each probe returns None when the predicate
keeps that contract, else the text of the FAIL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from conformance.checks import fakes
from conformance.checks.batch import at_least_two_rows, batch_size
from conformance.checks.common import exception_line

# Batch sizes probed on fakes: small, odd, just past powers of two, and far beyond any declared case.
PROBE_ROWS = (2, 3, 17, 257, 4097, 65537)

STATIC_FIX = ("it must decide from dtype, device, the non-batch shape and strides and argument values, "
              "or compiled graphs with a dynamic batch select differently or recompile")
FAKE_FIX = ("lowering calls supports_args on fake tensors with symbolic sizes: read no tensor data or data "
            "pointers and turn no batch size into a Python int; return bool(...) of static properties, or a "
            "SymBool of non-batch sizes")


def _fmt(answer) -> str:
    return str(answer) if type(answer) is bool else type(answer).__name__


def at_batch_sizes(op, impl, args: Sequence[Any], answer: bool) -> str | None:
    """The real answer (when the case has >= 2 rows) equals the fake answers at PROBE_ROWS rows."""
    n = batch_size(op, args)
    if n is None:
        return None
    batch_fakes = fakes.BatchFakes(op, args)
    first: tuple[int, bool] | None = None      # (rows, answer) every later answer must equal
    if n >= 2:
        fake = _call_fake(impl, batch_fakes.at(n).args, f"fake tensors with {n} rows")
        if isinstance(fake, str):
            return fake
        if fake != answer:
            return (f"supports_args answers {answer} on real tensors but {fake} on fake tensors of the same "
                    f"shape, strides and dtype ({n} rows): lowering calls it on fake tensors, so compiled "
                    f"graphs would select another provider than eager; {STATIC_FIX}")
        first = (n, answer)
    for rows in PROBE_ROWS:
        got = _call_fake(impl, batch_fakes.at(rows).args, f"fake tensors with {rows} rows")
        if isinstance(got, str):
            return got
        first = first or (rows, got)
        if got != first[1]:
            return (f"supports_args guards on the batch size: {first[1]} with {first[0]} rows, {got} with "
                    f"{rows} rows (probed on fake tensors of the case's layout); {STATIC_FIX}")
    return None


def _call_fake(impl, args, where: str):
    """The predicate's bool answer on fakes, or the FAIL text when it raises or answers a non-bool."""
    try:
        got = impl.supports_args(*args)
    except Exception as exc:  # noqa: BLE001 - any raise here is the finding
        return f"supports_args raised on {where}: {exception_line(exc)}; {FAKE_FIX}"
    if type(got) is not bool:
        return f"supports_args returned {_fmt(got)} on {where}, not a Python bool; {STATIC_FIX}"
    return got


def symbolic_batch(op, impl, args: Sequence[Any], answer: bool) -> str | None:
    """Under a symbolic batch (>= 2): no raise, no guard on the batch, no SymBool of the batch, and
    an answer that, when static, equals the real one."""
    if batch_size(op, args) is None:
        return None
    fa = fakes.symbolic(op, at_least_two_rows(op, args))
    before = len(fa.shape_env.guards)
    try:
        got = impl.supports_args(*fa.args)
    except Exception as exc:  # noqa: BLE001 - any raise here is the finding
        return f"supports_args raised under a symbolic batch size (as lowering calls it): {exception_line(exc)}; {FAKE_FIX}"
    guards = [g.expr for g in fa.shape_env.guards[before:] if fa.involves_batch(g.expr)]
    if guards:
        return (f"supports_args guards on the batch size: under a symbolic batch it needs "
                f"{fa.render(guards[0])}, so a compiled graph holds only for that batch range; {STATIC_FIX}")
    if isinstance(got, torch.SymBool):
        from torch.fx.experimental.symbolic_shapes import statically_known_true   # here: it imports sympy (0.5 s)

        if statically_known_true(got):
            got = True
        elif statically_known_true(torch.sym_not(got)):
            got = False
        elif fa.involves_batch(got.node.expr):
            return (f"supports_args guards on the batch size: under a symbolic batch it returns "
                    f"SymBool({fa.render(got.node.expr)}); {STATIC_FIX}")
        else:
            return None
    elif type(got) is not bool:
        return f"supports_args returned {_fmt(got)} under a symbolic batch size, not a bool or SymBool; {STATIC_FIX}"
    n = batch_size(op, args)
    if n >= 2 and got != answer:
        return (f"supports_args answers {answer} on real tensors but {got} under a symbolic batch (as lowering "
                f"calls it): compiled graphs would select another provider than eager; {STATIC_FIX}")
    return None


def every_dim_symbolic(op, impl, args: Sequence[Any]) -> str | None:
    """With every dim symbolic (`torch.compile(dynamic=True)`): a bool or SymBool, without raising."""
    fa = fakes.symbolic(op, at_least_two_rows(op, args), every_dim=True)
    try:
        got = impl.supports_args(*fa.args)
    except Exception as exc:  # noqa: BLE001 - any raise here is the finding
        return (f"supports_args raised with every dimension symbolic (torch.compile(dynamic=True)): "
                f"{exception_line(exc)}; {FAKE_FIX}")
    if type(got) is not bool and not isinstance(got, torch.SymBool):
        return (f"supports_args returned {_fmt(got)} with every dimension symbolic (torch.compile(dynamic=True)), "
                f"not a bool or SymBool; {STATIC_FIX}")
    return None
